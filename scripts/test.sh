#!/usr/bin/env bash
# The project's test command: installs the pinned sglang-router into .venv/
# and the pinned vLLM CPU stack into .venv-vllm/ if missing (the scenario
# tests route through the real routers, and one tier runs a real vLLM pair),
# builds every binary the scenarios start, then runs all tests.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup-router.sh
# promtool and systemd-analyze check the metrics and the deploy files (issue 18).
./scripts/setup-checks.sh
# The real-engine tier (issue 15): vLLM CPU + vllm-router + a tiny model in
# .venv-vllm/ (once: ~3 min, 3 GB; 9 GB free while installing).
./scripts/setup-vllm.sh
# The HA tier (issue 19): Debian's etcd-server and protoc (the orchestrator's
# `etcd` feature builds etcd-client, whose build runs protoc).
./scripts/setup-etcd.sh
# Everything is built and tested with the etcd feature on (a superset of the
# default build; .ci/run also builds the default, protoc-free one).
features=(--features pdwarden-stack/etcd)
cargo build --workspace --bins "${features[@]}"
# Tests left out on this host, by exact name, each group said NOT RUN with
# its reason before and after the run (never counted as passed).
skips=()
not_run=()
leave_out() { # REASON NAME…
  local reason=$1; shift
  not_run+=("$reason")
  for t in "$@"; do skips+=(--skip "$t"); done
}
scenario_tests() { # the scenario tests whose names start with PREFIX
  cargo test -q -p pdwarden-stack "${features[@]}" --test scenarios -- --list 2>/dev/null \
    | sed -n "s/^\($1[a-z0-9_]*\): test\$/\1/p"
}
unavailable=${VLLM_VENV:-.venv-vllm}/.unavailable
if [ -f "$unavailable" ]; then
  # setup-vllm found that this host's CPU cannot run the pinned wheels.
  names=$(scenario_tests 'vllm::')
  [ -n "$names" ] || { echo "test: could not list the vllm:: scenarios to leave out" >&2; exit 1; }
  # shellcheck disable=SC2086
  leave_out "the real-vLLM tier ($(echo "$names" | wc -l) vllm:: scenarios): $(cat "$unavailable")" $names
fi
# Packaging (issue 38): the Debian package of this build's binaries, the
# throw-away Debian root it is installed into, and the container image the
# manifests name, all made before the tests (none is built under them).
package_tests=(package::deb_installs_into_a_throwaway_root_with_owners_and_modes_and_starts_nothing
               package::image_the_manifests_name_is_built_here_and_runs_version_and_help
               package::vllm_image_holds_the_agent_the_engine_and_the_router)
# The vLLM image pulls ~10 GB of CUDA wheels from PyPI: ~16 GB of disk at its
# peak and ~7 minutes (measured on a 2-core host), more than CI has to spare.
vllm_image=()
if [ "${PDWARDEN_VLLM_IMAGE:-0}" = 1 ]; then vllm_image=(--vllm); fi
if [ "$(id -u)" != 0 ]; then
  leave_out "the packaging tier (dpkg --root and buildah need root; running as uid $(id -u))" "${package_tests[@]}"
else
  ./scripts/package-deb.sh --profile dev --no-build >/dev/null
  ./scripts/setup-debroot.sh >/dev/null
  rc=0
  ./scripts/build-image.sh --profile dev --no-build "${vllm_image[@]}" >/dev/null || rc=$?
  if [ "$rc" = 3 ]; then
    leave_out "the container image tests: $(cat target/image/unavailable)" "${package_tests[@]:1}"
  elif [ "$rc" != 0 ]; then
    echo "test: scripts/build-image.sh failed (exit $rc)" >&2; exit "$rc"
  fi
  if [ ${#vllm_image[@]} = 0 ]; then
    leave_out "the vLLM image (deploy/container/Containerfile.vllm: ~10 GB of CUDA wheels, ~16 GB of disk while building, ~7 min): set PDWARDEN_VLLM_IMAGE=1 to build and test it" "${package_tests[2]}"
  fi
fi
for r in "${not_run[@]}"; do echo "test: NOT RUN on this host, $r" >&2; done
if [ ${#skips[@]} -gt 0 ]; then
  cargo test --workspace "${features[@]}" -- --exact "${skips[@]}"
else
  cargo test --workspace "${features[@]}"
fi
for r in "${not_run[@]}"; do echo "test: reminder: NOT RUN here, $r" >&2; done
