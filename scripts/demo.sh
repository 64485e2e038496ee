#!/usr/bin/env bash
# Runs `pdwarden demo` on a fresh machine: installs the pinned sglang-router
# into .venv/ if missing, builds the workspace, then starts a whole local
# stack and runs a real `restart pd-pair`. Extra arguments go to the demo
# (e.g. --json, --decode-start-policy overlap, --hold).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup-router.sh
cargo build --workspace --quiet
exec ./target/debug/pdwarden demo "$@"
