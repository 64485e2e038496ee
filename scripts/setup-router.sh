#!/usr/bin/env bash
# Installs the pinned real sglang-router into the project-local venv .venv/
# (idempotent). pdwarden's demo and scenario tests use .venv/bin/smg.
set -euo pipefail
cd "$(dirname "$0")/.."
SGLANG_ROUTER_VERSION="0.3.2"
if [ -x .venv/bin/smg ] && .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('sglang-router') != '$SGLANG_ROUTER_VERSION')" 2>/dev/null; then
  exit 0
fi
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null || { echo "setup-router: python3 not found (needed for sglang-router)" >&2; exit 1; }
"$PY" -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check "sglang-router==$SGLANG_ROUTER_VERSION"
echo "setup-router: installed sglang-router $SGLANG_ROUTER_VERSION into .venv/" >&2
