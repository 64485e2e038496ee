#!/usr/bin/env bash
# Measures what a capture's py-spy dump costs a healthy Python process
# (issue 35: "never stops or slows a healthy engine"): a busy loop records
# its longest gap between two iterations over 6 s, alone, then while py-spy
# dumps it 20 times with --nonblocking (what the agent runs), then in
# py-spy's default (blocking) mode for comparison.
# Usage: scripts/py-spy-pause.sh [PY_SPY]   (default .venv/bin/py-spy)
set -euo pipefail
cd "$(dirname "$0")/.."
PY_SPY=${1:-.venv/bin/py-spy}
[ -x "$PY_SPY" ] || { echo "py-spy-pause: $PY_SPY not found: run scripts/setup-router.sh" >&2; exit 1; }
loop='
import time, sys
last = time.perf_counter(); worst = 0.0; n = 0; end = last + 6.0
while True:
    now = time.perf_counter()
    if now > end: break
    worst = max(worst, now - last); last = now; n += 1
    sum(range(200))
print(f"{n} iterations, longest gap {worst * 1000:.2f} ms", flush=True)
'
for mode in alone nonblocking blocking; do
  out=$(mktemp)
  python3 -c "$loop" >"$out" &
  pid=$!
  sleep 0.5
  if [ "$mode" != alone ]; then
    flag=(); [ "$mode" = nonblocking ] && flag=(--nonblocking)
    for _ in $(seq 20); do "$PY_SPY" dump --pid "$pid" "${flag[@]}" >/dev/null 2>&1 || true; sleep 0.2; done
  fi
  wait "$pid"
  echo "$mode: $(cat "$out")"
  rm -f "$out"
done
