#!/usr/bin/env bash
# make deps: makes sure what the build needs is there.
#   check.sh DEBIAN_PACKAGE...
# On Debian (dpkg-query exists): the packages that are missing are installed
# with apt-get when running as root; as an ordinary user they are listed with
# the command to install them, and the target fails.
# Elsewhere (another distribution, a cluster's modules, Spack): there are no
# packages to name, so the commands the build runs are checked (CMake, a C++
# compiler, the MPI compiler wrapper and launcher, pkg-config) and CMake's
# find_package reports any library it cannot find (docs/building.md lists
# them with the versions tested). Nothing is installed.
set -euo pipefail
if ! command -v dpkg-query > /dev/null 2>&1; then
  missing=()
  for cmd in cmake "${CXX:-c++}" "${MPICXX:-mpicxx}" "${MPIEXEC:-mpiexec}" pkg-config; do
    command -v "$cmd" > /dev/null 2>&1 || missing+=("$cmd")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "make deps: not Debian, and these commands are missing: ${missing[*]}" >&2
    echo "make deps: load your site's modules (an MPI, a compiler, CMake >= 3.20) or see docs/building.md" >&2
    exit 1
  fi
  echo "make deps: not Debian: the commands are there; CMake checks the libraries (docs/building.md)"
  exit 0
fi
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "make deps: all Debian packages present"
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get > /dev/null 2>&1; then
  echo "make deps: missing Debian packages: ${missing[*]}" >&2
  echo "make deps: install them (sudo apt-get install ${missing[*]}), or build with plain CMake against" \
       "libraries found elsewhere (docs/building.md)" >&2
  exit 1
fi
echo "make deps: installing ${missing[*]}"
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
