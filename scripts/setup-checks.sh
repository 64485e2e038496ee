#!/usr/bin/env bash
# Installs the checkers the tests run on pdwarden's outputs and deploy files,
# if missing (issue 18): `promtool` (Debian's `prometheus` package, ~50 MB:
# `promtool check metrics` on both /metrics expositions) and
# `systemd-analyze` (Debian's `systemd`: `systemd-analyze verify` on the
# units in deploy/systemd/), and `kubernetes-validate` (PyPI, with the
# Kubernetes schemas, ~150 MB) in .venv-checks/ for the manifests in
# deploy/kubernetes/. Idempotent; needs root (or sudo) for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."
K8S_VALIDATE_VERSION="1.37.0"
if ! .venv-checks/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('kubernetes-validate') != '$K8S_VALIDATE_VERSION')" 2>/dev/null; then
  PY=${PYTHON:-python3}
  "$PY" -m venv .venv-checks
  .venv-checks/bin/pip install --quiet --disable-pip-version-check "kubernetes-validate==$K8S_VALIDATE_VERSION"
  echo "setup-checks: installed kubernetes-validate $K8S_VALIDATE_VERSION into .venv-checks/" >&2
fi
missing=()
command -v promtool >/dev/null || missing+=(prometheus)
command -v systemd-analyze >/dev/null || missing+=(systemd)
[ ${#missing[@]} -eq 0 ] && exit 0
. "$(dirname "$0")/lib-apt.sh"
apt_install setup-checks "${missing[@]}"
for c in promtool systemd-analyze; do
  command -v "$c" >/dev/null || { echo "setup-checks: $c still missing after installing ${missing[*]}" >&2; exit 1; }
done
echo "setup-checks: installed ${missing[*]}" >&2
