#!/usr/bin/env bash
# Installs what packaging needs, if missing (issue 38): cargo-deb at the
# pinned version (crates.io, ~2 min to build), and Debian's debootstrap and
# buildah (the throw-away root and the container image). Idempotent; apt-get
# needs root (or sudo). scripts/setup-debroot.sh and build-image.sh call it;
# scripts/package-deb.sh calls it with --cargo-deb (only cargo-deb: the
# package builds without root); .ci/run calls it with the other installs.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO_DEB_VERSION=3.8.0
case "${1:-}" in
  --cargo-deb) only_cargo_deb=1 ;;
  "") only_cargo_deb=0 ;;
  *) echo "setup-package: unknown argument '$1' (expected --cargo-deb or nothing)" >&2; exit 2 ;;
esac
if [ "$(cargo deb --version 2>/dev/null | awk '{print $2}')" != "$CARGO_DEB_VERSION" ]; then
  echo "setup-package: installing cargo-deb $CARGO_DEB_VERSION (crates.io)" >&2
  cargo install --quiet --locked cargo-deb --version "$CARGO_DEB_VERSION"
fi
[ "$only_cargo_deb" = 1 ] && exit 0
missing=()
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v buildah >/dev/null || missing+=(buildah)
[ ${#missing[@]} -eq 0 ] && exit 0
. "$(dirname "$0")/lib-apt.sh"
apt_install setup-package "${missing[@]}"
for c in debootstrap buildah; do
  command -v "$c" >/dev/null || { echo "setup-package: $c still missing after installing ${missing[*]}" >&2; exit 1; }
done
echo "setup-package: installed ${missing[*]}" >&2
