#!/usr/bin/env bash
# Installs what the HA tier needs, if missing (issue 19): Debian's
# `etcd-server` (the real etcd the HA scenarios run three members of, on
# loopback) and `protobuf-compiler` (`protoc`: the `etcd-client` crate's
# build runs it, so the orchestrator's `etcd` feature needs it; the default
# build does not). ~40 MB. Idempotent; needs root (or sudo) for apt-get.
set -euo pipefail
missing=()
command -v etcd >/dev/null || missing+=(etcd-server)
command -v protoc >/dev/null || missing+=(protobuf-compiler)
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
command -v apt-get >/dev/null || { echo "setup-etcd: ${missing[*]} missing and no apt-get: install etcd (3.4+) and protoc by hand" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
# Debian's etcd-server would start a system etcd on :2379; the tests start
# their own members on free ports, so keep the packaged service down.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
if ! $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
fi
for c in etcd protoc; do
  command -v "$c" >/dev/null || { echo "setup-etcd: $c still missing after installing ${missing[*]}" >&2; exit 1; }
done
echo "setup-etcd: installed ${missing[*]} ($(etcd --version | head -1), $(protoc --version))" >&2
