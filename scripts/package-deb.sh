#!/usr/bin/env bash
# The Debian package (issue 38): the three binaries, both systemd units, the
# example configs (as documentation; none installed live), shell completions
# and man pages, and maintainer scripts that make the pdwarden user and the
# directories with their modes and start nothing (packaging/deb/).
#
#   scripts/package-deb.sh [--profile release|dev] [--no-build]
#
# --profile: the cargo profile whose binaries are packaged (default release).
# --no-build: package the binaries already in target/ (scripts/test.sh does,
#   after its workspace build, so that nothing is rebuilt under the tests).
#
# Prints the .deb's absolute path (target/debian/pdwarden_*.deb), and only
# that, on stdout: `sudo apt install "$(scripts/package-deb.sh)"` builds and
# installs it.
# Needs cargo-deb (scripts/setup-package.sh installs the pinned one) and
# protoc (the orchestrator is built with its `etcd` feature, for HA:
# scripts/setup-etcd.sh installs Debian's protobuf-compiler). CI packages
# its dev-profile build (`--profile dev`) to save a release build's time.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) [ $# -ge 2 ] || { echo "package-deb: --profile needs a value (release or dev)" >&2; exit 2; }
               profile=$2; shift 2 ;;
    --profile=*) profile=${1#--profile=}; shift ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "package-deb: unknown argument '$1' (expected --profile release|dev, --no-build)" >&2; exit 2 ;;
  esac
done
case "$profile" in release|dev) ;; *) echo "package-deb: --profile must be release or dev, not '$profile'" >&2; exit 2 ;; esac
dir=$([ "$profile" = dev ] && echo debug || echo release)

./scripts/setup-package.sh --cargo-deb
if [ "$build" = 1 ]; then
  command -v protoc >/dev/null || { echo "package-deb: protoc not found (the orchestrator's etcd feature needs it): run scripts/setup-etcd.sh" >&2; exit 1; }
  cargo build --profile "$profile" -p pdwarden-cli -p pdwarden-agent -p pdwarden-orchestrator \
    --features pdwarden-orchestrator/etcd --bins
fi
for b in pdwarden pdwarden-agent pdwarden-orchestrator; do
  [ -x "target/$dir/$b" ] || { echo "package-deb: target/$dir/$b not built (run without --no-build)" >&2; exit 1; }
done

# Generated assets, listed in cli/Cargo.toml's [package.metadata.deb].
gen=target/pdwarden-deb
rm -rf "$gen" && mkdir -p "$gen/completions" "$gen/man"
pdwarden=target/$dir/pdwarden
"$pdwarden" completions bash > "$gen/completions/pdwarden.bash"
"$pdwarden" completions zsh > "$gen/completions/_pdwarden"
"$pdwarden" completions fish > "$gen/completions/pdwarden.fish"
"$pdwarden" man "$gen/man"
gzip -9n "$gen"/man/*.1

# cargo-deb maps the assets' target/release/ onto the chosen profile's dir.
# Symbols are kept (--no-strip): a panic's backtrace names its functions.
out=$(cargo deb -p pdwarden-cli --no-build --profile "$profile" --no-strip --fast -o target/debian/ 2>&1) || {
  echo "$out" >&2; echo "package-deb: cargo deb failed" >&2; exit 1; }
deb=$(echo "$out" | grep '\.deb$' | tail -1)
[ -f "$deb" ] || { echo "$out" >&2; echo "package-deb: cargo deb did not say where the package is" >&2; exit 1; }
echo "$PWD/$deb"
