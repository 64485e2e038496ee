#!/usr/bin/env bash
# NVML on a real GPU (issue 6's device check). Needs an NVIDIA driver and a
# python3 with PyTorch (to put processes on the GPU); not part of the test
# suite, which runs without GPUs against the fake source.
#
#   scripts/gpu-check.sh BIN_DIR OUT_DIR
#
# BIN_DIR holds pdwarden-orchestrator, pdwarden-agent and pdwarden. Starts an
# orchestrator and an agent with `gpu_source = "nvml"` supervising one unit
# that holds GPU memory, plus a foreign process the agent does not supervise,
# then checks what NVML reported: the agent's one-shot reading, its /metrics,
# and `pdwarden status` (the unit's process mapped to the unit, the other one
# flagged foreign). Writes every reading to OUT_DIR and a verdict per check;
# exits non-zero if any check failed. Every process it starts is stopped by
# PID; the GPU holders also end by themselves after HOLD_S seconds.
set -uo pipefail
BIN=$(cd "$1" && pwd)
OUT=$2
HOLD_S=${HOLD_S:-120}
mkdir -p "$OUT"
W=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    sleep 2
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
}
trap cleanup EXIT

cat >"$W/hold.py" <<'EOF'
# Holds MIB MiB of GPU memory and keeps the GPU lightly busy for SECONDS.
import sys, time, torch
mib, seconds = int(sys.argv[1]), float(sys.argv[2])
held = torch.empty(mib * 2**20, dtype=torch.uint8, device="cuda")
a = torch.randn(2048, 2048, device="cuda")
print(f"holding {mib} MiB on {torch.cuda.get_device_name()}", flush=True)
end = time.time() + seconds
while time.time() < end:
    a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
    time.sleep(0.02)
EOF

echo "== nvidia-smi"
nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.used,memory.total,temperature.gpu,power.draw,power.limit --format=csv | tee "$OUT/nvidia-smi.csv"
# The driver's own word on retired pages and remapped rows, to compare with the reading.
nvidia-smi -q -d ROW_REMAPPER,PAGE_RETIREMENT >"$OUT/nvidia-smi-memory-errors.txt" 2>&1

echo "== one-shot reading, idle"
"$BIN/pdwarden-agent" --gpu-report nvml >"$OUT/report-idle.json" 2>"$OUT/report-idle.err"
echo "exit $? ($(wc -c <"$OUT/report-idle.json") bytes)"; cat "$OUT/report-idle.err"

python3 "$W/hold.py" 1536 "$HOLD_S" >"$OUT/foreign.log" 2>&1 &
FOREIGN=$!
PIDS+=("$FOREIGN")

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ORCH=$(port); METRICS=$(port)
cat >"$W/orchestrator.toml" <<EOF
listen = "127.0.0.1:$ORCH"
journal = "$W/journal.sqlite"
insecure_plaintext = true

[[pair]]
name = "gpu-pair"
# Only holder-0 exists: nothing is restarted here, the pair only has to be valid.
prefill = [{ host = "gpu-host", unit = "holder-0" }]
decode = [{ host = "gpu-host", unit = "absent-decode" }]
router = [{ host = "gpu-host", unit = "absent-router" }]

[pair.probe]
model = "none"
prompt = "unused: this check restarts nothing"
warm_budget_ms = 1000
cold_allowance_ms = 5000
probe_timeout_ms = 10000

# Nothing here may be restarted by the watch.
[pair.watch]
auto_recover = false
EOF
cat >"$W/agent.toml" <<EOF
host = "gpu-host"
orchestrator = "http://127.0.0.1:$ORCH"
insecure_plaintext = true
state_dir = "$W/agent"
on_exit = "stop-units"
gpu_source = "${GPU_SOURCE:-nvml}"
gpu_sample_interval_ms = 500
gpu_snapshot_interval_ms = 2000
metrics_listen = "127.0.0.1:$METRICS"

[[unit]]
name = "holder-0"
role = "decode"
argv = ["python3", "$W/hold.py", "2048", "$HOLD_S"]
base_url = "http://127.0.0.1:9"
autostart = true
EOF
"$BIN/pdwarden-orchestrator" --config "$W/orchestrator.toml" >"$OUT/orchestrator.log" 2>&1 &
PIDS+=("$!")
sleep 1
"$BIN/pdwarden-agent" --config "$W/agent.toml" >"$OUT/agent.log" 2>&1 &
AGENT=$!
PIDS+=("$AGENT")

echo "== waiting for both GPU holders to allocate"
for _ in $(seq 1 60); do
    grep -q holding "$OUT/foreign.log" && grep -qs holding "$W/agent/logs/holder-0.log" && break
    sleep 1
done
cat "$OUT/foreign.log"; ls "$W/agent" "$W/agent/logs" 2>/dev/null
sleep 5
echo "== one-shot reading, busy"
"$BIN/pdwarden-agent" --gpu-report nvml >"$OUT/report-busy.json" 2>"$OUT/report-busy.err"
echo "exit $?"; cat "$OUT/report-busy.err"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv | tee "$OUT/nvidia-smi-apps.csv"
"$BIN/pdwarden" --orchestrator "http://127.0.0.1:$ORCH" status --json >"$OUT/status.json" 2>"$OUT/status.err"
echo "status exit $?"; cat "$OUT/status.err"
"$BIN/pdwarden" --orchestrator "http://127.0.0.1:$ORCH" status >"$OUT/status.txt" 2>&1
curl -s "http://127.0.0.1:$METRICS/metrics" >"$OUT/metrics.txt" || python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$METRICS/metrics').read().decode())" >"$OUT/metrics.txt"

echo "== agent footprint over 20 s with NVML sampling every 500 ms"
t0=$(awk '{print $14+$15}' "/proc/$AGENT/stat"); sleep 20; t1=$(awk '{print $14+$15}' "/proc/$AGENT/stat")
rss=$(awk '/VmRSS/{print $2}' "/proc/$AGENT/status")
hz=$(getconf CLK_TCK)
echo "{\"agent_rss_kib\": $rss, \"agent_cpu_pct\": $(python3 -c "print(round(($t1-$t0)/$hz/20*100, 2))")}" | tee "$OUT/footprint.json"

echo "== checks"
FOREIGN=$FOREIGN OUT=$OUT python3 - <<'EOF' | tee "$OUT/verdict.txt"
import json, os, sys
out = os.environ["OUT"]; foreign = int(os.environ["FOREIGN"])
ok = True
def check(name, cond, detail=""):
    global ok
    ok &= bool(cond)
    print(("PASS " if cond else "FAIL ") + name + (f": {detail}" if detail else ""))
idle = json.load(open(f"{out}/report-idle.json"))
g = idle["gpus"]
check("one-shot reading lists the GPUs", len(g) >= 1, f"{len(g)} GPU(s)")
for x in g:
    check(f"gpu {x.get('index')} uuid and name", str(x.get("uuid", "")).startswith("GPU-") and x.get("name"), f"{x.get('uuid')} {x.get('name')}")
    check(f"gpu {x.get('index')} memory total", x.get("memory_total_bytes", 0) > 2**30, x.get("memory_total_bytes"))
    if any(n in str(x.get("name")) for n in ["A100", "A30", "H100", "H200", "H20", "GH200", "B200", "B100"]):
        check(f"gpu {x.get('index')} remapped rows read (row remapping GPU)", x.get("remapped_rows") is not None, x.get("remapped_rows"))
    for k in ["temperature_c", "power_draw_mw", "power_limit_mw", "utilization_gpu_pct", "ecc", "retired_pages", "remapped_rows", "throttle_reasons"]:
        print(f"info gpu {x.get('index')} {k} = {x.get(k)!r}")
    print(f"info gpu {x.get('index')} read_errors = {x.get('read_errors')!r}")
busy = json.load(open(f"{out}/report-busy.json"))
pids = {p["pid"]: p for x in busy["gpus"] for p in x.get("processes", [])}
print(f"info busy reading processes: {pids}")
check("one-shot reading lists the foreign holder's pid", foreign in pids, f"pid {foreign}")
st = json.load(open(f"{out}/status.json"))
text = json.dumps(st)
def walk(v):
    if isinstance(v, dict):
        yield v
        for w in v.values(): yield from walk(w)
    elif isinstance(v, list):
        for w in v: yield from walk(w)
procs = [d for d in walk(st) if "pid" in d and "foreign" in d]
print(f"info status gpu processes: {procs}")
check("status: gpu_source nvml with GPUs", '"gpu_source": "nvml"' in text and any("uuid" in d for d in walk(st)))
unit_procs = [p for p in procs if p.get("unit") == "holder-0" and not p["foreign"]]
check("status: the unit's GPU process is mapped to unit holder-0", unit_procs, unit_procs)
fp = [p for p in procs if p["pid"] == foreign]
check("status: the unsupervised holder is flagged foreign", fp and fp[0]["foreign"], fp)
findings = [d for d in walk(st) if "severity" in d and "kind" in d]
print(f"info findings: {findings}")
check("status: a finding names the foreign process", any(str(foreign) in json.dumps(f) for f in findings))
m = open(f"{out}/metrics.txt").read()
check("metrics: NVML reporting available", 'pdwarden_gpu_reporting_available{host="gpu-host",source="nvml"} 1' in m)
fpj = json.load(open(f"{out}/footprint.json"))
print(f"info agent footprint: {fpj} (targets: <= 20480 KiB, <= 0.5 %)")
sys.exit(0 if ok else 1)
EOF
