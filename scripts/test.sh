#!/usr/bin/env bash
# The project's test command: installs the pinned sglang-router into .venv/
# and the pinned vLLM CPU stack into .venv-vllm/ if missing (the scenario
# tests route through the real routers, and one tier runs a real vLLM pair),
# builds every binary the scenarios start, then runs all tests.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup-router.sh
# promtool and systemd-analyze check the metrics and the deploy files (issue 18).
./scripts/setup-checks.sh
# The real-engine tier (issue 15): vLLM CPU + vllm-router + a tiny model in
# .venv-vllm/ (once: ~3 min, 3 GB; 10 GB free while installing).
./scripts/setup-vllm.sh
cargo build --workspace --bins
cargo test --workspace
