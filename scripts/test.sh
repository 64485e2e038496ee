#!/usr/bin/env bash
# The project's test command: installs the pinned sglang-router into .venv/
# if missing (the scenario tests route through the real router), builds every
# binary the scenarios start, then runs all tests.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup-router.sh
cargo build --workspace --bins
cargo test --workspace
