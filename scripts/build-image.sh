#!/usr/bin/env bash
# The container images the Kubernetes manifests name (issue 38), from
# deploy/container/Containerfile{,.vllm}, with buildah:
#
#   scripts/build-image.sh [--profile release|dev] [--no-build] [--vllm]
#
# --profile and --no-build are passed to scripts/package-deb.sh.
#
#   ghcr.io/pdwarden/pdwarden:VERSION       (VERSION: the workspace's crate version)
#     Debian bookworm minbase (scripts/setup-debroot.sh) with the Debian
#     package (scripts/package-deb.sh --profile P) installed by dpkg, the
#     pdwarden user made uid/gid 10001 first (the manifests' runAsUser), then
#     committed by `buildah bud --isolation chroot` from a scratch image.
#   ghcr.io/pdwarden/pdwarden-vllm:VERSION  (--vllm, after the first)
#     adds vLLM (CUDA build), vllm-router and NIXL from PyPI: ~10 GB, minutes.
#
# The images land in buildah's local storage (`buildah images`); push one with
# `buildah push IMAGE docker://REGISTRY/...` or save it with
# `buildah push IMAGE oci-archive:FILE`. Writes target/image/built (one line
# per image: name and ID), which the image test reads. Needs root (the root
# file system holds files of several owners), Debian's buildah and
# debootstrap (scripts/setup-package.sh) and Debian's mirror. Where this host
# cannot build images at all (not root, buildah cannot run), it writes the
# reason to target/image/unavailable and exits 3; any other failure is 1.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
nobuild=()
vllm=0
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) [ $# -ge 2 ] || { echo "build-image: --profile needs a value (release or dev)" >&2; exit 2; }
               profile=$2; shift 2 ;;
    --profile=*) profile=${1#--profile=}; shift ;;
    --no-build) nobuild=(--no-build); shift ;;
    --vllm) vllm=1; shift ;;
    -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-image: unknown argument '$1' (expected --profile release|dev, --no-build, --vllm)" >&2; exit 2 ;;
  esac
done
out=target/image
mkdir -p "$out"
rm -f "$out/unavailable" "$out/built"
unavailable() { echo "$1" > "$out/unavailable"; echo "build-image: cannot build images on this host: $1" >&2; exit 3; }
[ "$(id -u)" = 0 ] || unavailable "needs root (a root file system of several owners), running as uid $(id -u)"
./scripts/setup-package.sh
if ! info=$(buildah info 2>&1); then
  unavailable "buildah cannot run here: $(echo "$info" | tail -1)"
fi
version=$(cargo metadata --no-deps --format-version 1 \
  | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"]=="pdwarden-cli"))')
image=ghcr.io/pdwarden/pdwarden:$version

deb=$(./scripts/package-deb.sh --profile "$profile" "${nobuild[@]}" | tail -1)
base=$(./scripts/setup-debroot.sh)
ctx=$out/context
rootfs=$out/rootfs
rm -rf "$ctx" "$rootfs" && mkdir -p "$ctx"
cp -a "$base" "$rootfs"
rm -f "$rootfs/.pdwarden-debroot"
# The manifests run the orchestrator as uid/gid 10001 (runAsUser, fsGroup):
# the package's postinst finds this user and keeps it.
chroot "$rootfs" groupadd --system --gid 10001 pdwarden
chroot "$rootfs" useradd --system -K SYS_UID_MAX=10001 --uid 10001 --gid pdwarden --home-dir /var/lib/pdwarden \
  --no-create-home --shell /usr/sbin/nologin --comment "pdwarden orchestrator" pdwarden
dpkg --root="$rootfs" -i "$deb" >/dev/null
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log
# /dev, /proc and /sys are the runtime's; numeric owners keep uid 10001.
tar -C "$rootfs" --numeric-owner --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
  -cf "$ctx/pdwarden-rootfs.tar" .
rm -rf "$rootfs"
: > "$out/built"
build() { # NAME CONTAINERFILE [ARGS…]
  local name=$1 file=$2; shift 2
  buildah bud --quiet --isolation chroot --layers=false -f "$file" -t "$name" "$@" "$ctx" >/dev/null
  echo "$name $(buildah inspect --type image --format '{{.FromImageID}}' "$name")" >> "$out/built"
  echo "build-image: built $name" >&2
}
build "$image" deploy/container/Containerfile \
  --label org.opencontainers.image.version="$version" \
  --label org.opencontainers.image.title=pdwarden
rm -f "$ctx/pdwarden-rootfs.tar"
if [ "$vllm" = 1 ]; then
  # Behind a TLS-inspecting proxy, pip needs the host's CA bundle (PIP_CERT):
  # mounted for the build only.
  ca=()
  if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
    ca=(--volume "$PIP_CERT:/run/pdwarden-build-ca.crt:ro" --build-arg BUILD_CA=/run/pdwarden-build-ca.crt)
  fi
  build "ghcr.io/pdwarden/pdwarden-vllm:$version" deploy/container/Containerfile.vllm \
    --build-arg BASE="$image" "${ca[@]}" \
    --label org.opencontainers.image.version="$version" \
    --label org.opencontainers.image.title=pdwarden-vllm
fi
# An earlier build of the same name left its image untagged: drop those.
buildah rmi --prune >/dev/null 2>&1 || true
cat "$out/built"
