#!/bin/sh
# Installs the Debian packages fsdpd needs that this machine lacks.
# Checks with dpkg-query (fast, no network) and calls apt-get only when something
# is missing, with sudo when not root. Usage: mk/deps.sh [package...]
set -eu
missing=""
for p in "$@"; do
  st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  case "$st" in
    *"install ok installed"*) ;;
    *) missing="$missing $p" ;;
  esac
done
[ -z "$missing" ] && exit 0
echo "deps: installing$missing" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
echo "deps: done" >&2
