#!/usr/bin/env bash
# A minimal Debian root file system (issue 38), made once with debootstrap
# (--variant=minbase, plus adduser, which the package's postinst needs):
# the throw-away root the Debian package is installed into by its test, and
# the base of the container image (scripts/build-image.sh). No registry
# image is reachable from here; Debian's mirror is.
#
#   scripts/setup-debroot.sh            prints the root's path (target/debroot/bookworm)
#
# Needs root (debootstrap makes device nodes and runs dpkg in a chroot) and
# Debian's debootstrap (scripts/setup-package.sh). ~25 s, ~210 MB.
# DEBIAN_MIRROR overrides the mirror (default http://deb.debian.org/debian).
set -euo pipefail
cd "$(dirname "$0")/.."
suite=bookworm
root=target/debroot/$suite
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
stamp="$root/.pdwarden-debroot"
want="$suite minbase +adduser $mirror"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$root"; exit 0
fi
[ "$(id -u)" = 0 ] || { echo "setup-debroot: needs root (debootstrap), running as uid $(id -u)" >&2; exit 1; }
./scripts/setup-package.sh
rm -rf "$root" && mkdir -p "$(dirname "$root")"
log=$(mktemp)
if ! debootstrap --variant=minbase --include=adduser "$suite" "$root" "$mirror" >"$log" 2>&1; then
  tail -20 "$log" >&2; rm -f "$log"; echo "setup-debroot: debootstrap $suite from $mirror failed" >&2; exit 1
fi
rm -f "$log"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
echo "$want" > "$stamp"
echo "$root"
