#!/usr/bin/env python3
# scripts/nvml-profile.py: needs only python3 and the NVIDIA driver (no pdwarden build).
# Where an NVML reader's memory and CPU go: RSS, anonymous memory and the
# driver libraries mapped after each stage (dlopen, init, first call of each
# query the agent makes, event set), then CPU per full sample and per event wait.
import ctypes as C, time
def roll():
    d = {}
    for l in open('/proc/self/smaps_rollup'):
        p = l.split()
        if p[0] in ('Rss:', 'Anonymous:', 'Pss:'): d[p[0][:-1]] = int(p[1])
    return d
def libs():
    return sorted({l.split()[-1].split('/')[-1] for l in open('/proc/self/maps') if ('nvidia' in l or 'cuda' in l) and '/' in l})
def threads():
    return int([l for l in open('/proc/self/status') if l.startswith('Threads')][0].split()[1])
last = roll()
def stage(name):
    global last
    r = roll()
    print(f"{name:40s} rss {r['Rss']:7d} KiB (+{r['Rss']-last['Rss']:6d})  anon {r['Anonymous']:7d} (+{r['Anonymous']-last['Anonymous']:6d})  threads {threads():2d}  libs {libs()}")
    last = r
stage('python baseline')
nv = C.CDLL('libnvidia-ml.so.1'); stage('dlopen libnvidia-ml')
print('init rc', nv.nvmlInit_v2()); stage('nvmlInit_v2')
n = C.c_uint(); nv.nvmlDeviceGetCount_v2(C.byref(n)); stage('DeviceGetCount')
h = C.c_void_p(); nv.nvmlDeviceGetHandleByIndex_v2(0, C.byref(h)); stage('GetHandleByIndex')
buf = C.create_string_buffer(8192); u = C.c_uint(); ull = C.c_ulonglong(); i1 = C.c_int(); i2 = C.c_int()
def fields():
    fv = (C.c_byte * (40 * 4))()
    for k, fid in enumerate([142, 143, 144, 145]):
        C.c_uint.from_buffer(fv, 40 * k).value = fid
    return nv.nvmlDeviceGetFieldValues(h, 4, fv)
calls = [
    ('uuid', lambda: nv.nvmlDeviceGetUUID(h, buf, 96)),
    ('name', lambda: nv.nvmlDeviceGetName(h, buf, 96)),
    ('memory', lambda: nv.nvmlDeviceGetMemoryInfo(h, buf)),
    ('utilization', lambda: nv.nvmlDeviceGetUtilizationRates(h, buf)),
    ('temperature', lambda: nv.nvmlDeviceGetTemperature(h, 0, C.byref(u))),
    ('power', lambda: nv.nvmlDeviceGetPowerUsage(h, C.byref(u))),
    ('power_limit', lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h, C.byref(u))),
    ('throttle', lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(h, C.byref(ull))),
    ('ecc_mode', lambda: nv.nvmlDeviceGetEccMode(h, C.byref(i1), C.byref(i2))),
    ('ecc_total x4', lambda: [nv.nvmlDeviceGetTotalEccErrors(h, e, c, C.byref(ull)) for e in (0, 1) for c in (0, 1)][-1]),
    ('retired_pages x2', lambda: [nv.nvmlDeviceGetRetiredPages(h, cause, C.byref(C.c_uint(0)), None) for cause in (0, 1)][-1]),
    ('remapped_rows (field values)', fields),
    ('compute_processes', lambda: nv.nvmlDeviceGetComputeRunningProcesses_v3(h, C.byref(C.c_uint(64)), buf)),
    ('graphics_processes', lambda: nv.nvmlDeviceGetGraphicsRunningProcesses_v3(h, C.byref(C.c_uint(64)), buf)),
]
for name, f in calls:
    rc = f(); stage(f'first {name} (rc {rc})')
es = C.c_void_p(); print('eventset rc', nv.nvmlEventSetCreate(C.byref(es))); stage('EventSetCreate')
print('register rc', nv.nvmlDeviceRegisterEvents(h, C.c_ulonglong(1 | 2 | 8), es)); stage('RegisterEvents')
print()
N = 200
for name, f in calls:
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(N): f()
    c1, w1 = time.process_time(), time.perf_counter()
    print(f"{name:30s} cpu {1e6*(c1-c0)/N:9.1f} us/call  wall {1e6*(w1-w0)/N:9.1f} us/call")
c0, w0 = time.process_time(), time.perf_counter()
for _ in range(N):
    for _, f in calls: f()
c1, w1 = time.process_time(), time.perf_counter()
cs = (c1 - c0) / N
print(f"full sample: cpu {1e3*cs:.3f} ms, wall {1e3*(w1-w0)/N:.3f} ms -> at one sample per 2 s: {100*cs/2:.3f} % of a core")
ed = C.create_string_buffer(256)
c0, w0 = time.process_time(), time.perf_counter()
for _ in range(5): nv.nvmlEventSetWait_v2(es, ed, 1000)
c1, w1 = time.process_time(), time.perf_counter()
print(f"event wait 5 x 1000 ms: cpu {1e3*(c1-c0):.2f} ms over {w1-w0:.2f} s -> {100*(c1-c0)/(w1-w0):.3f} % of a core")
stage('after timing')
