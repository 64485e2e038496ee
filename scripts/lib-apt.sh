# Sourced by the setup scripts: Debian packages through apt-get.
#
#   apt_install WHO PACKAGE…
#
# Installs the packages (sudo when not root), refreshing the package lists
# once if the first try fails (a fresh machine has none); says which were
# missing, naming WHO, where there is no apt-get.
apt_install() {
  local who=$1; shift
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  command -v apt-get >/dev/null || { echo "$who: $* missing and no apt-get: install them by hand" >&2; exit 1; }
  local apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get)
  if ! "${apt[@]}" install -y --no-install-recommends "$@" >/dev/null 2>&1; then
    "${apt[@]}" update -qq
    "${apt[@]}" install -y --no-install-recommends "$@" >/dev/null
  fi
}
