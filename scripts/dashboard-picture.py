#!/usr/bin/env python3
"""Draws deploy/grafana/pdwarden-dashboard.json from a real `pdwarden demo` run.

There is no Grafana here, so this script is its own tiny renderer:

1. starts `pdwarden demo --json --hold` (orchestrator, agent, pd-sim engines,
   the real sglang-router; mutual TLS and a throw-away operator token), the
   agent reading a fake GPU file that this script rewrites every second
   (the machine has no GPU);
2. starts Prometheus (loopback, a temporary TSDB) scraping the orchestrator's
   readiness `/metrics` and the agent's `metrics_listen` every second;
3. drives the held stack with the real CLI: verifications, co-restarts, a
   wedged decode (SIGSTOP) that the watch recovers on its own, and a change
   gate;
4. asks Prometheus `/api/v1/query_range` for every expression of every panel
   and draws the dashboard's grid as one SVG (Python standard library only);
5. stops everything it started, by PID, and removes its temporary directory.

Usage (from the repository root, after `cargo build --workspace --bins`):

    python3 scripts/dashboard-picture.py [--out deploy/grafana/dashboard.svg]

Nothing is invented: a panel whose queries return nothing says "no data".
"""

import argparse
import json
import math
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from xml.sax.saxutils import escape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30

# pd-sim's knob (as in the gate scenarios): PDW_KNOB=on slows generation.
KNOB = "--tpot-ms 24 --knob-env PDW_KNOB --knob-value on --knob-slowdown 1.25"


def log(msg):
    print(f"[dashboard-picture {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# Processes


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(p, name, grace=30.0):
    """SIGTERM to the process (it stops what it started), then SIGKILL to its group."""
    if p is None or p.poll() is not None:
        return
    log(f"stopping {name} (pid {p.pid})")
    try:
        os.kill(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        log(f"{name} did not stop within {grace:.0f} s; SIGKILL to its process group")
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=10)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def http_get(url, timeout=10):
    req = urllib.request.Request(url)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=timeout) as r:
        return r.read().decode()


class Demo:
    """`pdwarden demo --json --hold`: its JSON report, then held until SIGTERM."""

    def __init__(self, bin_dir, tmp, gpu_file):
        self.bin = os.path.join(bin_dir, "pdwarden")
        self.err_path = os.path.join(tmp, "demo.stderr")
        argv = [
            self.bin, "demo", "--json", "--hold", "--gpu-fake", gpu_file,
            "--prefill-sim", KNOB, "--decode-sim", KNOB,
        ]
        log("starting: " + " ".join(argv[:6]) + " ...")
        self.err = open(self.err_path, "w")
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.err,
            start_new_session=True, text=True, cwd=ROOT,
        )
        self.lines = queue.Queue()
        threading.Thread(target=self._drain, daemon=True).start()
        self.report = None

    def _drain(self):
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_report(self, limit):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.proc.poll() is not None and self.lines.empty():
                raise RuntimeError(f"the demo exited ({self.proc.returncode}): {self.stderr_tail()}")
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                continue
            if line.startswith("{"):
                self.report = json.loads(line)
                if "error" in self.report and "demo" not in self.report:
                    raise RuntimeError(f"the demo could not run: {self.report['error']}")
                return self.report
        raise RuntimeError(f"the demo printed no report within {limit} s: {self.stderr_tail()}")

    def stderr_tail(self):
        self.err.flush()
        with open(self.err_path) as f:
            return f.read()[-2000:]

    def cli(self, args, limit=120):
        d = self.report["demo"]
        argv = [self.bin, "--orchestrator", d["orchestrator"]]
        if d.get("ca"):
            argv += ["--ca", d["ca"]]
        env = dict(os.environ)
        if d.get("token"):
            env["PDWARDEN_TOKEN"] = d["token"]  # not on the command line (ps)
        try:
            r = subprocess.run(argv + args, env=env, capture_output=True, text=True, timeout=limit, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return None, ""
        return r.returncode, r.stdout

    def status(self):
        code, out = self.cli(["status", "--json"], limit=30)
        lines = [l for l in out.splitlines() if l.startswith("{")]
        return json.loads(lines[-1]) if code == 0 and lines else None

    def stop(self):
        stop_process(self.proc, "pdwarden demo", grace=60)
        self.err.close()


def watch_of(status):
    for w in (status or {}).get("watch") or []:
        if w.get("pair") == "demo":
            return w
    return {}


def unit_pids(status):
    pids = {}
    for agent in (status or {}).get("agents") or []:
        for u in agent.get("units") or []:
            if u.get("pid"):
                pids[u["name"]] = u["pid"]
    return pids


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


# --------------------------------------------------------------------------
# The fake GPU file (no GPU on this machine): a deterministic profile


class FakeGpus:
    """Rewrites the agent's `fake:PATH` GPU file every second (atomically)."""

    # (seconds after the start, gpu index, kind, xid, detail)
    EVENTS = [
        (25, 1, "xid", 13, "graphics engine exception"),
        (55, 0, "ecc_single_bit", 0, "corrected"),
        (85, 1, "xid", 13, "graphics engine exception"),
        (120, 0, "ecc_single_bit", 0, "corrected"),
        (160, 1, "xid", 13, "graphics engine exception"),
    ]

    def __init__(self, path):
        self.path = path
        self.t0 = time.monotonic()
        self.stop_flag = threading.Event()
        self.write(0.0)

    def reading(self, t, i):
        u = 0.30 + 0.28 * max(0.0, math.sin(t / 23.0)) if i == 0 else 0.55 + 0.22 * math.sin(t / 17.0 + 1.0)
        u = min(1.0, max(0.0, u))
        foreign = i == 1 and 90 <= t < 180
        used = (52 + 2 * math.sin(t / 40.0)) * GIB if i == 0 else 61 * GIB + (3 * GIB if foreign else 0)
        g = {
            "index": i, "uuid": f"GPU-FAKE-{i}", "name": "fake H100",
            "memory_used_bytes": int(used), "memory_total_bytes": 80 * GIB,
            "utilization_gpu_pct": round(100 * u), "utilization_memory_pct": round(60 * u),
            "temperature_c": round(45 + 18 * u), "power_draw_mw": round((110 + 480 * u) * 1000),
            "power_limit_mw": 700_000,
            "throttle_reasons": ["sw_power_cap"] if u > 0.74 else [],
            "ecc": {"volatile_corrected": sum(1 for e in self.EVENTS if e[0] <= t and e[1] == i and e[2] == "ecc_single_bit")},
            "retired_pages": 0, "remapped_rows": {"correctable": 0},
            "processes": [{"pid": 1, "used_memory_bytes": 3 * GIB}] if foreign else [],
        }
        return g

    def write(self, t):
        body = {
            "gpus": [self.reading(t, 0), self.reading(t, 1)],
            "events": [
                {"gpu_index": g, "kind": k, "xid": x, "detail": d} for (at, g, k, x, d) in self.EVENTS if at <= t
            ],
        }
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(body, f)
        os.replace(tmp, self.path)

    def run(self):
        while not self.stop_flag.wait(1.0):
            self.write(time.monotonic() - self.t0)

    def start(self):
        self.t0 = time.monotonic()
        threading.Thread(target=self.run, daemon=True).start()


# --------------------------------------------------------------------------
# Prometheus


class Prometheus:
    def __init__(self, binary, tmp, targets):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = os.path.join(tmp, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n")
            f.write("scrape_configs:\n")
            for job, target in targets:
                f.write(f"  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n")
        self.log_path = os.path.join(tmp, "prometheus.log")
        self.log = open(self.log_path, "w")
        argv = [
            binary, f"--config.file={cfg}", f"--storage.tsdb.path={os.path.join(tmp, 'tsdb')}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1d",
        ]
        log(f"starting prometheus on {self.url}")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                                     start_new_session=True, cwd=tmp)

    def wait_ready(self, limit=60):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("prometheus exited: " + open(self.log_path).read()[-2000:])
            try:
                http_get(self.url + "/-/ready", timeout=2)
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("prometheus not ready within 60 s")

    def targets_up(self):
        v = json.loads(http_get(self.url + "/api/v1/targets"))
        return [t["health"] == "up" for t in v["data"]["activeTargets"]]

    def query_range(self, expr, start, end, step):
        q = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step}s"})
        v = json.loads(http_get(f"{self.url}/api/v1/query_range?{q}", timeout=60))
        if v.get("status") != "success":
            raise RuntimeError(f"{expr}: {v}")
        return v["data"]["result"]

    def stop(self):
        stop_process(self.proc, "prometheus", grace=30)
        self.log.close()


# --------------------------------------------------------------------------
# What the script does to the held stack


class Actions:
    def __init__(self):
        self.done = []  # (start, end, label, outcome)

    def run(self, label, fn):
        t0 = time.time()
        log(f"{label} ...")
        outcome = fn()
        t1 = time.time()
        log(f"{label}: {outcome} ({t1 - t0:.1f} s)")
        self.done.append((t0, t1, label, outcome))
        return outcome


def cli_verdict(demo, args, limit):
    code, out = demo.cli(args + ["--json"], limit=limit)
    if code is None:
        return f"no answer within {limit} s"
    lines = [l for l in out.splitlines() if l.startswith("{")]
    try:
        return json.loads(lines[-1]).get("verdict", f"exit {code}")
    except (IndexError, ValueError):
        return f"exit {code}"


def wedge_and_recover(demo, limit=180):
    """SIGSTOP the decode (its port accepts, nothing answers) until the watch recovers the pair."""
    st = demo.status()
    pid = unit_pids(st).get("decode-0")
    if not pid:
        return "no decode pid"
    before = (watch_of(st).get("last_recovery") or {}).get("operation_id")
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            time.sleep(1)
            w = watch_of(demo.status())
            rec = w.get("last_recovery") or {}
            if rec.get("operation_id") and rec.get("operation_id") != before and w.get("state") == "healthy":
                return f"recovered: {rec.get('verdict')}"
        return f"not recovered within {limit} s"
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def drive(demo, acts, quiet_s):
    def pause(s):
        time.sleep(s)

    pause(quiet_s)
    acts.run("verify", lambda: cli_verdict(demo, ["verify", "demo"], 120))
    pause(10)
    acts.run("restart pd-pair", lambda: cli_verdict(demo, ["restart", "pd-pair", "demo"], 180))
    pause(10)
    acts.run("verify", lambda: cli_verdict(demo, ["verify", "demo"], 120))
    pause(10)
    acts.run("SIGSTOP decode", lambda: wedge_and_recover(demo))
    pause(10)
    acts.run("gate PDW_KNOB=on", lambda: cli_verdict(demo, ["gate", "demo", "--set-env", "PDW_KNOB=on"], 420))
    pause(10)
    # A second of each: a series Prometheus first sees at 1 (a histogram's
    # first observation, a counter's first event) shows no increase until
    # the next one.
    acts.run("SIGSTOP decode", lambda: wedge_and_recover(demo))
    pause(10)
    acts.run("gate PDW_KNOB=on", lambda: cli_verdict(demo, ["gate", "demo", "--set-env", "PDW_KNOB=on"], 420))
    pause(10)
    acts.run("restart pd-pair", lambda: cli_verdict(demo, ["restart", "pd-pair", "demo"], 180))
    pause(5)
    acts.run("verify", lambda: cli_verdict(demo, ["verify", "demo"], 120))
    pause(quiet_s)


# --------------------------------------------------------------------------
# Drawing

BG, PANEL, BORDER, TEXT, DIM, GRID = "#111217", "#181b1f", "#2c3235", "#ccccdc", "#8e8e9e", "#2a2d33"
PALETTE = ["#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9", "#8ab8ff", "#fade2a",
           "#37872d", "#c4162a", "#1f60c4", "#fa6400", "#8f3bb8", "#96d98d", "#ffb357", "#ca95e5"]
STATE_COLOURS = {
    "healthy": "#73bf69", "unproven": "#8e8e9e", "suspect": "#fade2a", "wedged": "#f2495c",
    "down": "#c4162a", "recovering": "#ff9830", "operation_running": "#5794f2", "held": "#b877d9",
    "starting": "#8ab8ff",
}
W = 1600
PAD = 8
UNIT_H = 34
FONT = "font-family=\"Inter, Helvetica, Arial, sans-serif\""


def text_w(s, size):
    return len(s) * size * 0.56


def fit(s, size, width):
    if text_w(s, size) <= width:
        return s
    n = max(1, int(width / (size * 0.56)) - 1)
    return s[:n] + "…"


def legend_label(fmt, metric):
    out = fmt or ""
    while "{{" in out:
        a = out.index("{{")
        b = out.find("}}", a)
        if b < 0:
            break
        out = out[:a] + str(metric.get(out[a + 2:b].strip(), "")) + out[b + 2:]
    out = " ".join(out.split())
    return out or json.dumps(metric)


def fmt_value(v, unit):
    if v is None or math.isnan(v):
        return "–"
    if unit == "percentunit":
        return f"{v * 100:.0f}%" if abs(v) >= 0.1 or v == 0 else f"{v * 100:.1f}%"
    if unit == "bytes":
        for div, suf in ((GIB, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if abs(v) >= div:
                x = v / div
                return f"{x:.0f} {suf}" if x >= 10 else f"{x:.1f} {suf}"
        return f"{v:.0f} B"
    if unit == "s":
        if v == 0:
            return "0 s"
        if abs(v) < 1:
            return f"{v * 1000:.0f} ms"
        return f"{v:.1f} s" if abs(v) < 10 else f"{v:.0f} s"
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{v:.2f}".rstrip("0").rstrip(".")


def nice_ticks(lo, hi, n=4, unit=""):
    if unit == "bytes":
        # Whole GiB / MiB / KiB, not fractions of 10^k bytes.
        top = max(abs(lo), abs(hi))
        div = next((d for d in (GIB, 1 << 20, 1 << 10) if top >= d), 1)
        return [t * div for t in nice_ticks(lo / div, hi / div, n)]
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    for _ in range(20):
        if v > hi + step * 1e-9:
            break
        ticks.append(round(v, 12))
        v += step
    return ticks


def time_ticks(t0, t1, width):
    span = t1 - t0
    for step in (10, 15, 30, 60, 120, 300, 600):
        if span / step <= max(2, width / 75):
            break
    first = math.ceil(t0 / step) * step
    return [first + k * step for k in range(int((t1 - first) // step) + 1)]


def hhmmss(t):
    return time.strftime("%H:%M:%S", time.gmtime(t))


def points(result):
    pts = []
    for ts, v in result.get("values", []):
        try:
            x = float(v)
        except ValueError:
            continue
        if math.isnan(x) or math.isinf(x):
            continue
        pts.append((float(ts), x))
    return pts


class Svg:
    def __init__(self):
        self.parts = []

    def add(self, s):
        self.parts.append(s)

    def text(self, x, y, s, size=11, fill=TEXT, anchor="start", weight="normal"):
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" fill="{fill}" text-anchor="{anchor}"'
                 f' font-weight="{weight}">{escape(s)}</text>')

    def rect(self, x, y, w, h, fill, stroke="none", rx=0, extra=""):
        self.add(f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(0, w):.1f}" height="{max(0, h):.1f}" fill="{fill}"'
                 f' stroke="{stroke}" rx="{rx}"{extra}/>')

    def line(self, x1, y1, x2, y2, stroke=GRID, width=1, extra=""):
        self.add(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{stroke}"'
                 f' stroke-width="{width}"{extra}/>')


def draw_legend(svg, x, y, w, entries, max_lines):
    """entries: [(colour, label)]; flows left to right; returns the height used."""
    size, lh = 10, 13
    cx, line = x, 0
    shown = 0
    for i, (colour, label) in enumerate(entries):
        label = fit(label, size, w - 20)
        ew = 14 + text_w(label, size) + 12
        if cx + ew > x + w and cx > x:
            line += 1
            cx = x
        if line >= max_lines:
            break
        if line == max_lines - 1 and i < len(entries) - 1:
            rest = f"+{len(entries) - i} more"
            if cx + ew + text_w(rest, size) + 6 > x + w:
                svg.text(cx, y + line * lh + 9, rest, size, DIM)
                shown = -1
                break
        svg.rect(cx, y + line * lh + 3, 10, 4, colour, rx=1)
        svg.text(cx + 14, y + line * lh + 9, label, size, DIM)
        cx += ew
        shown += 1
    return (line + 1) * lh if entries else 0


def no_data(svg, x, y, w, h, why="no data"):
    svg.text(x + w / 2, y + h / 2, why, 13, DIM, "middle")


def plot_frame(svg, px, py, pw, ph, t0, t1, lo, hi, unit):
    for v in nice_ticks(lo, hi, unit=unit):
        if v < lo - 1e-12 or v > hi + 1e-12:
            continue
        yy = py + ph - (v - lo) / (hi - lo) * ph
        svg.line(px, yy, px + pw, yy)
        svg.text(px - 4, yy + 3.5, fmt_value(v, unit), 9.5, DIM, "end")
    for t in time_ticks(t0, t1, pw):
        xx = px + (t - t0) / (t1 - t0) * pw
        svg.line(xx, py, xx, py + ph)
        svg.text(xx, py + ph + 12, hhmmss(t)[:5] if t % 60 == 0 else hhmmss(t), 9.5, DIM, "middle")


def draw_timeseries(svg, x, y, w, h, panel, series, t0, t1, step):
    unit = ((panel.get("fieldConfig") or {}).get("defaults") or {}).get("unit", "")
    empty = [s for s in series if s.get("empty_expr")]
    series = [s for s in series if s["points"]]
    if not series:
        return no_data(svg, x, y, w, h)
    entries = [(PALETTE[i % len(PALETTE)], s["label"]) for i, s in enumerate(series)]
    entries += [("#444", f"{s['label']}: no data") for s in empty]
    # The legend's height first (measured on a throw-away canvas).
    leg_h = draw_legend(Svg(), x + 8, 0, w - 16, entries, 3)
    px, py, pw = x + 56, y + 6, w - 56 - 12
    ph = h - 6 - 18 - leg_h - 4
    vals = [v for s in series for _, v in s["points"]]
    lo, hi = min(vals), max(vals)
    if lo >= 0:
        lo = 0.0
    if unit == "percentunit" and hi <= 1:
        hi = 1.0
    if hi - lo < 1e-12:
        hi = lo + (abs(lo) if lo else 1.0)
    ticks = nice_ticks(lo, hi, unit=unit)
    hi = max(hi, ticks[-1])
    lo = min(lo, ticks[0])
    plot_frame(svg, px, py, pw, ph, t0, t1, lo, hi, unit)
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        segs, cur, last_t = [], [], None
        for t, v in s["points"]:
            if last_t is not None and t - last_t > 2.5 * step:
                segs.append(cur)
                cur = []
            cur.append((t, v))
            last_t = t
        segs.append(cur)
        for seg in segs:
            # Keep only the ends of a run of equal values: a flat line needs two points.
            kept = [p for k, p in enumerate(seg)
                    if k in (0, len(seg) - 1) or not (seg[k - 1][1] == p[1] == seg[k + 1][1])]
            coords = " ".join(
                f"{px + (t - t0) / (t1 - t0) * pw:.1f},{py + ph - (v - lo) / (hi - lo) * ph:.1f}" for t, v in kept)
            if len(kept) == 1:
                cx, cy = coords.split(",")
                svg.add(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{colour}"/>')
            else:
                svg.add(f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="1.4"'
                        ' stroke-linejoin="round"/>')
    draw_legend(svg, x + 8, py + ph + 18, w - 16, entries, 3)


def draw_state_timeline(svg, x, y, w, h, series, t0, t1, step):
    series = [s for s in series if s["points"]]
    if not series:
        return no_data(svg, x, y, w, h)
    pairs = sorted({s["metric"].get("pair", "") for s in series})
    states = []
    for s in series:
        st = s["metric"].get("state", "")
        if st not in states:
            states.append(st)
    leg = [(STATE_COLOURS.get(st, PALETTE[i % len(PALETTE)]), st) for i, st in enumerate(states)]
    px, py, pw = x + 70, y + 8, w - 70 - 12
    ph = h - 8 - 18 - 18
    rowh = min(150, ph / len(pairs))
    for k, pair in enumerate(pairs):
        ry = py + k * rowh
        svg.rect(px, ry + 2, pw, rowh - 4, "#22252b")
        svg.text(px - 6, ry + rowh / 2 + 4, pair, 11, TEXT, "end")
        for s in series:
            if s["metric"].get("pair", "") != pair:
                continue
            colour = STATE_COLOURS.get(s["metric"].get("state", ""), "#888")
            for t, _ in s["points"]:
                a = max(t0, t - step / 2)
                b = min(t1, t + step / 2)
                svg.rect(px + (a - t0) / (t1 - t0) * pw, ry + 2, (b - a) / (t1 - t0) * pw + 0.6, rowh - 4, colour)
    for t in time_ticks(t0, t1, pw):
        xx = px + (t - t0) / (t1 - t0) * pw
        svg.line(xx, py + len(pairs) * rowh, xx, py + len(pairs) * rowh + 4, DIM)
        svg.text(xx, py + len(pairs) * rowh + 15, hhmmss(t)[:5] if t % 60 == 0 else hhmmss(t), 9.5, DIM, "middle")
    draw_legend(svg, px, py + len(pairs) * rowh + 20, pw, leg, 1)


def draw_stat(svg, x, y, w, h, panel, series, t0, t1):
    series = [s for s in series if s["points"]]
    if not series:
        return no_data(svg, x, y, w, h)
    held = "held" in panel["title"].lower()
    n = len(series)
    cw = w / n
    for k, s in enumerate(series):
        last = s["points"][-1][1]
        good = (last == 0) if held else (last == 1)
        colour = "#73bf69" if good else "#f2495c"
        cx = x + k * cw
        # A sparkline along the bottom (Grafana's stat "area" graph mode).
        vals = [v for _, v in s["points"]]
        lo, hi = min(vals + [0]), max(vals + [1])
        base = y + h - 8
        coords = " ".join(f"{cx + 8 + (t - t0) / (t1 - t0) * (cw - 16):.1f},{base - (v - lo) / (hi - lo) * (h * 0.35):.1f}"
                          for t, v in s["points"])
        svg.add(f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-opacity="0.6" stroke-width="1.2"/>')
        svg.text(cx + cw / 2, y + h * 0.42, fmt_value(last, ""), 40, colour, "middle", "bold")
        svg.text(cx + cw / 2, y + h * 0.42 + 20, s["label"], 11, DIM, "middle")


def draw_table(svg, x, y, w, h, series, label_cols):
    series = [s for s in series if s["points"]]
    if not series:
        return no_data(svg, x, y, w, h)
    tend = max(s["points"][-1][0] for s in series)
    # The table shows the newest evaluation, as Grafana's instant table does.
    rows = [s for s in series if s["points"][-1][0] == tend]
    cols = label_cols + ["value"]
    cw = (w - 16) / len(cols)
    svg.rect(x + 8, y + 4, w - 16, 20, "#22252b")
    for c, name in enumerate(cols):
        svg.text(x + 14 + c * cw, y + 18, name, 11, TEXT, weight="bold")
    for r, s in enumerate(rows[: int((h - 30) // 20)]):
        ry = y + 26 + r * 20
        for c, name in enumerate(cols):
            v = fmt_value(s["points"][-1][1], "") if name == "value" else s["metric"].get(name, "")
            colour = TEXT
            if name == "verdict":
                colour = "#73bf69" if v.startswith("healthy") or v == "kept" else "#ff9830"
            svg.text(x + 14 + c * cw, ry + 13, fit(v, 11, cw - 8), 11, colour)
        svg.line(x + 8, ry + 19, x + w - 8, ry + 19, BORDER)


def render(dashboard, data, t0, t1, step, acts, meta):
    svg = Svg()
    panels = dashboard["panels"]
    colw = (W - 2 * PAD) / 24
    header = 104
    height = header + max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels) * UNIT_H + PAD
    svg.rect(0, 0, W, height, BG)
    svg.text(PAD + 4, 24, f"{dashboard.get('title', 'pdwarden')} — deploy/grafana/pdwarden-dashboard.json", 17, TEXT,
             weight="bold")
    svg.text(PAD + 4, 42, "Drawn by scripts/dashboard-picture.py from Prometheus range queries (/api/v1/query_range) "
             "of a real `pdwarden demo --hold` run — not Grafana's rendering.", 11.5, TEXT)
    svg.text(PAD + 4, 58, meta, 11, DIM)
    # What the script did, on the same time axis as the panels.
    sx, sw = PAD + 4 + 56 + 60, W - 2 * PAD - 56 - 12 - 64
    svg.text(PAD + 4, 84, "what the script did:", 10.5, DIM)
    svg.rect(sx, 72, sw, 18, "#22252b")
    xs = [sx + (max(a, t0) - t0) / (t1 - t0) * sw for (a, _, _, _) in acts] + [sx + sw]
    for k, (a, b, label, outcome) in enumerate(acts):
        ax = xs[k]
        bx = sx + (min(b, t1) - t0) / (t1 - t0) * sw
        ok = any(w in str(outcome) for w in ("healthy", "recovered", "kept"))
        svg.add(f"<g><title>{escape(f'{label}: {outcome} ({b - a:.1f} s)')}</title>")
        svg.rect(ax, 72, max(2, bx - ax), 18, "#1f60c4" if ok else "#fa6400", extra=' fill-opacity="0.75"')
        svg.text(ax + 3, 85, fit(f"{label} → {outcome}", 9.5, xs[k + 1] - ax - 4), 9.5, TEXT)
        svg.add("</g>")
    for p in panels:
        g = p["gridPos"]
        x = PAD + g["x"] * colw
        y = header + g["y"] * UNIT_H
        w = g["w"] * colw - 6
        h = g["h"] * UNIT_H - 6
        if p["type"] == "row":
            svg.text(x + 4, y + 22, p["title"], 14, TEXT, weight="bold")
            continue
        svg.rect(x, y, w, h, PANEL, BORDER, rx=3)
        svg.text(x + 8, y + 17, fit(p["title"], 12, w - 16), 12, TEXT, weight="bold")
        series = data.get(p["id"], [])
        ix, iy, iw, ih = x, y + 24, w, h - 28
        if p["type"] == "timeseries":
            draw_timeseries(svg, ix, iy, iw, ih, p, series, t0, t1, step)
        elif p["type"] == "state-timeline":
            draw_state_timeline(svg, ix, iy, iw, ih, series, t0, t1, step)
        elif p["type"] == "stat":
            draw_stat(svg, ix, iy, iw, ih, p, series, t0, t1)
        elif p["type"] == "table":
            draw_table(svg, ix, iy, iw, ih, series, ["pair", "verdict"])
        else:
            no_data(svg, ix, iy, iw, ih, f"panel type {p['type']} not drawn")
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height:.0f}" '
            f'viewBox="0 0 {W} {height:.0f}" {FONT}>')
    return head + "\n" + "\n".join(svg.parts) + "\n</svg>\n"


# --------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "deploy/grafana/dashboard.svg"))
    ap.add_argument("--dashboard", default=os.path.join(ROOT, "deploy/grafana/pdwarden-dashboard.json"))
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "target/debug"))
    ap.add_argument("--prometheus", default=shutil.which("prometheus") or "/usr/bin/prometheus")
    ap.add_argument("--quiet-s", type=int, default=20, help="seconds of calm before and after the activity")
    ap.add_argument("--save-data", help="also write the queried series to this JSON file")
    ap.add_argument("--from-data", help="draw again from a --save-data file (no stack, no Prometheus)")
    args = ap.parse_args()

    with open(args.dashboard) as f:
        dashboard = json.load(f)
    if args.from_data:
        with open(args.from_data) as f:
            saved = json.load(f)
        data = {int(k): v for k, v in saved["data"].items()}
        out = render(dashboard, data, saved["t0"], saved["t1"], saved["step"], saved["acts"], saved["meta"])
        with open(args.out, "w") as f:
            f.write(out)
        log(f"wrote {args.out} ({len(out) / 1024:.0f} KiB) from {args.from_data}")
        return
    began = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="pdw-dashpic-")
    demo = prom = gpus = None
    pids_seen = {}
    acts = Actions()
    try:
        gpus = FakeGpus(os.path.join(tmp, "gpus.json"))
        demo = Demo(args.bin_dir, tmp, gpus.path)
        report = demo.wait_report(limit=300)
        log(f"demo restart: {report.get('verdict')}; orchestrator {report['demo']['orchestrator']}")
        d = report["demo"]
        targets = [("orchestrator", urllib.parse.urlparse(d["readiness"]).netloc),
                   ("agent", urllib.parse.urlparse(d["agent_metrics"]).netloc)]
        prom = Prometheus(args.prometheus, tmp, targets)
        prom.wait_ready()
        gpus.start()
        t_start = time.time()
        for _ in range(30):
            ups = prom.targets_up()
            if len(ups) == 2 and all(ups):
                break
            time.sleep(1)
        log(f"scraping {targets}: up={prom.targets_up()}")
        remember = lambda: pids_seen.update({p: cmdline(p) for p in unit_pids(demo.status()).values()})
        remember()
        drive(demo, acts, args.quiet_s)
        remember()
        t_end = time.time()
        time.sleep(2)  # the last scrape in

        step = max(2, math.ceil((t_end - t_start) / 150))
        data, had = {}, []
        for p in dashboard["panels"]:
            if p["type"] == "row":
                continue
            series = []
            for t in p.get("targets", []):
                got = [{"metric": r["metric"], "label": legend_label(t.get("legendFormat"), r["metric"]),
                        "points": points(r)} for r in prom.query_range(t["expr"], t_start, t_end, step)]
                if not any(g["points"] for g in got):
                    # Said on the panel, not hidden: this expression answered nothing.
                    got = [{"metric": {}, "label": legend_label(t.get("legendFormat"), {}), "points": [],
                            "empty_expr": t["expr"]}]
                series.extend(got)
            data[p["id"]] = series
            n = sum(1 for s in series if s["points"])
            had.append((p["title"], n))
        meta = (f"{hhmmss(t_start)}–{hhmmss(t_end)} UTC {time.strftime('%Y-%m-%d', time.gmtime(t_start))}, "
                f"scraped every 1 s, step {step} s; the demo's initial co-restart ran before scraping began. "
                "GPU panels: the real agent reading a fake GPU file this script rewrites (no GPU on this machine).")
        if args.save_data:
            with open(args.save_data, "w") as f:
                json.dump({"data": data, "t0": t_start, "t1": t_end, "step": step, "acts": acts.done,
                           "meta": meta}, f)
        out = render(dashboard, data, t_start, t_end, step, acts.done, meta)
        with open(args.out, "w") as f:
            f.write(out)
        log(f"wrote {args.out} ({len(out) / 1024:.0f} KiB)")
        for title, n in had:
            log(f"  {'no data' if n == 0 else f'{n} series':>10}  {title}")
    finally:
        if gpus:
            gpus.stop_flag.set()
        if prom:
            prom.stop()
        if demo:
            demo.stop()
        # A unit the demo's stop missed (the same PID and command line as
        # the agent reported: never a reused PID).
        left = [p for p, cmd in pids_seen.items() if cmd and pid_alive(p) and cmdline(p) == cmd]
        if left:
            log(f"units still alive after the demo stopped: {left}; SIGKILL")
            for p in left:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(tmp, ignore_errors=True)
        log(f"done in {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
