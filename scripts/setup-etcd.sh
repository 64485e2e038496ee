#!/usr/bin/env bash
# Installs what the HA tier needs, if missing (issue 19): Debian's
# `etcd-server` (the real etcd the HA scenarios run three members of, on
# loopback), `protobuf-compiler` (`protoc`: the `etcd-client` crate's
# build runs it, so the orchestrator's `etcd` feature needs it; the default
# build does not) and `libprotobuf-dev` (the well-known types etcd's protos
# import, google/protobuf/descriptor.proto and struct.proto: protoc alone,
# installed without recommends, fails the build with "File not found" —
# CI's fresh machine did). ~50 MB. Idempotent; needs root (or sudo) for
# apt-get.
set -euo pipefail
# Whether protoc finds the well-known types etcd-client's protos import.
wkt_ok() {
  command -v protoc >/dev/null || return 1
  local d
  d=$(mktemp -d)
  printf 'syntax = "proto3";\nimport "google/protobuf/descriptor.proto";\nimport "google/protobuf/struct.proto";\n' >"$d/wkt.proto"
  protoc -I"$d" --descriptor_set_out=/dev/null "$d/wkt.proto" >/dev/null 2>&1
  local rc=$?
  rm -rf "$d"
  return $rc
}
missing=()
command -v etcd >/dev/null || missing+=(etcd-server)
command -v protoc >/dev/null || missing+=(protobuf-compiler)
wkt_ok || missing+=(libprotobuf-dev)
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
# Debian's etcd-server would start a system etcd on :2379; the tests start
# their own members on free ports, so keep the packaged service down.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
. "$(dirname "$0")/lib-apt.sh"
apt_install setup-etcd "${missing[@]}"
for c in etcd protoc; do
  command -v "$c" >/dev/null || { echo "setup-etcd: $c still missing after installing ${missing[*]}" >&2; exit 1; }
done
wkt_ok || { echo "setup-etcd: protoc does not find google/protobuf/descriptor.proto after installing ${missing[*]}" >&2; exit 1; }
echo "setup-etcd: installed ${missing[*]} ($(etcd --version | head -1), $(protoc --version))" >&2
