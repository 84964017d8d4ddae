#!/bin/sh
# Installs those of the given Debian packages that this machine lacks. The
# Makefile calls it once per package set (build, test, bench, demo), so a plain
# `make` installs only what compiling the programs needs.
# Checks with dpkg-query (fast, no network) and calls apt-get only when something
# is missing, with sudo when not root. Usage: mk/deps.sh [package...]
set -eu
# `make -j` reaches this from more than one target at once (the fuzz build is a
# sub-make): one runs apt-get at a time, and the others check again after it.
if [ -z "${FSDP_DEPS_LOCKED:-}" ] && command -v flock >/dev/null 2>&1; then
  FSDP_DEPS_LOCKED=1 exec flock "${TMPDIR:-/tmp}/fsdpd-deps.lock" sh "$0" "$@"
fi
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
$SUDO apt-get -o DPkg::Lock::Timeout=300 update -qq
# shellcheck disable=SC2086
$SUDO apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends $missing >/dev/null
echo "deps: done" >&2
