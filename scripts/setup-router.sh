#!/usr/bin/env bash
# Installs the pinned real sglang-router and py-spy into the project-local
# venv .venv/ (idempotent). pdwarden's demo and scenario tests use
# .venv/bin/smg; the agent's evidence tests (issue 35) use .venv/bin/py-spy.
set -euo pipefail
cd "$(dirname "$0")/.."
SGLANG_ROUTER_VERSION="0.3.2"
PY_SPY_VERSION="0.4.3"
if [ -x .venv/bin/smg ] && [ -x .venv/bin/py-spy ] && .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('sglang-router') != '$SGLANG_ROUTER_VERSION')" 2>/dev/null; then
  exit 0
fi
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null || { echo "setup-router: python3 not found (needed for sglang-router)" >&2; exit 1; }
"$PY" -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check "sglang-router==$SGLANG_ROUTER_VERSION" "py-spy==$PY_SPY_VERSION"
echo "setup-router: installed sglang-router $SGLANG_ROUTER_VERSION and py-spy $PY_SPY_VERSION into .venv/" >&2
