#!/usr/bin/env bash
# Installs what packaging needs, if missing (issue 38): cargo-deb at the
# pinned version (crates.io, ~2 min to build), and Debian's debootstrap and
# buildah (the throw-away root and the container image). Idempotent; apt-get
# needs root (or sudo). scripts/package-deb.sh, setup-debroot.sh and
# build-image.sh call it; .ci/run calls it with the other installs.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO_DEB_VERSION=3.8.0
if [ "$(cargo deb --version 2>/dev/null | awk '{print $2}')" != "$CARGO_DEB_VERSION" ]; then
  echo "setup-package: installing cargo-deb $CARGO_DEB_VERSION (crates.io)" >&2
  cargo install --quiet --locked cargo-deb --version "$CARGO_DEB_VERSION"
fi
missing=()
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v buildah >/dev/null || missing+=(buildah)
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
command -v apt-get >/dev/null || { echo "setup-package: ${missing[*]} missing and no apt-get: install them by hand" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
fi
for c in debootstrap buildah; do
  command -v "$c" >/dev/null || { echo "setup-package: $c still missing after installing ${missing[*]}" >&2; exit 1; }
done
echo "setup-package: installed ${missing[*]}" >&2
