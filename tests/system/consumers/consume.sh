#!/usr/bin/env bash
# Consumes overlap three ways and runs the consumer at 2 ranks each time:
#   install  cmake --install into a temporary prefix, find_package(overlap)
#            (and a request for another major version, which must fail), and
#            pkg-config --cflags --libs for each flavour (overlap,
#            overlap-compiled), whose versions must be the package's;
#   subdir   add_subdirectory of the source tree;
#   plain    mpicxx with only -I include and the dependencies.
set -euo pipefail
way=${1:?usage: consume.sh install|subdir|plain SOURCE_DIR BUILD_DIR}
src=$(cd "${2:?}" && pwd)
build=$(cd "${3:?}" && pwd)
here="$src/tests/system/consumers"
# In the build folder, and under the same name every run: the build's
# compiler cache (tools/build/ccache) then finds these compiles again, since
# it keys paths under the source tree relative to where they are compiled.
work="$build/consume-$way"
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
# The MPI stack of the tests (tools/mpi/stack: its launcher and flags).
source "$(dirname "$0")/../../../tools/mpi/stack"
mpi_stack_setup
run() { mpi_run 2 "$@"; }
# The consumers use the build's MPI (its compiler wrapper), as a project of
# the user's would.
mpicxx=$(sed -n 's/^MPI_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
mpicxx=${mpicxx:-mpicxx}
# The build's compiler launcher (ccache through tools/build/ccache), if any;
# the direct compiles below compile and link in two steps, since a compile
# that also links is one ccache cannot keep.
launcher=$(sed -n 's/^CMAKE_CXX_COMPILER_LAUNCHER:[A-Z]*=//p' "$build/CMakeCache.txt")
cmake_launcher=()
[ -z "$launcher" ] || cmake_launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher")
IFS=';' read -r -a compile <<<"$launcher"
compile+=("$mpicxx")
# Built without optimisation (no CMAKE_BUILD_TYPE; -O0): what is checked is
# that each way finds, compiles, links and runs the library, and at -O2 the
# three ways took 4.4 of CI's minutes, mostly compiling.
opt=-O0

case $way in
  install)
    cmake --install "$build" --prefix "$work/prefix" > /dev/null
    cmake -S "$here/find_package" -B "$work/b" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE= \
      -DMPI_CXX_COMPILER="$mpicxx" "${cmake_launcher[@]}" > /dev/null
    cmake --build "$work/b" -j 2 > /dev/null
    run "$work/b/consumer"
    run "$work/b/consumer_compiled"
    version=$(sed -n 's/^CMAKE_PROJECT_VERSION:[A-Z]*=//p' "$build/CMakeCache.txt")
    if cmake -S "$here/find_package" -B "$work/b2" -DCMAKE_PREFIX_PATH="$work/prefix" -DOVERLAP_REQUEST=99.0 \
      -DMPI_CXX_COMPILER="$mpicxx" > "$work/b2.log" 2>&1; then
      echo "find_package(overlap 99.0) accepted overlap $version" >&2; exit 1
    fi
    grep -q "version: $version" "$work/b2.log" || { cat "$work/b2.log" >&2; exit 1; }
    # pkg-config: one file per flavour, both at the package's version.
    export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
    for pc in overlap overlap-compiled; do
      got=$(pkg-config --modversion "$pc")
      [ "$got" = "$version" ] || { echo "$pc.pc has version '$got', the package $version" >&2; exit 1; }
      # shellcheck disable=SC2046
      "${compile[@]}" -std=c++17 $opt -c "$here/main.cpp" -o "$work/pc_$pc.o" $(pkg-config --cflags "$pc")
      "$mpicxx" "$work/pc_$pc.o" -o "$work/pc_$pc" $(pkg-config --libs "$pc")
      run "$work/pc_$pc"
    done
    # The Python package, where the build has one: from the prefix's
    # site-packages, at the package's version, computing across 2 ranks.
    python=$(sed -n 's/^OVERLAP_PYTHON_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt")
    site=$(sed -n 's/^OVERLAP_PYTHON_INSTALL_DIR:[A-Z]*=//p' "$build/CMakeCache.txt")
    if grep -q '^OVERLAP_BUILD_PYTHON:BOOL=ON' "$build/CMakeCache.txt"; then
      PYTHONPATH="$work/prefix/$site" run "$python" -c "
import numpy as np, overlap
assert overlap.__version__ == '$version' and overlap.__file__.startswith('$work/prefix/'), overlap.__file__
with overlap.Context() as ctx:
    c = overlap.all_gather_matmul(ctx, np.ones((2, 3)), np.ones((3, 4)), strategy='ring')
assert c.shape == (2 * ctx.size, 4) and (c == 3).all()
try:
    import torch
except ImportError:
    torch = None
if torch is not None:  # the subpackage installed as a package, beside the core
    import overlap.torch as ot
    assert ot.__file__.startswith('$work/prefix/') and ot.__file__.endswith('torch/__init__.py'), ot.__file__
    assert callable(ot.parallelize) and callable(ot.gather_state_dict)"
    fi
    ;;
  subdir)
    cmake -S "$here/add_subdirectory" -B "$work/b" -DOVERLAP_SOURCE_DIR="$src" -DCMAKE_BUILD_TYPE= \
      -DMPI_CXX_COMPILER="$mpicxx" "${cmake_launcher[@]}" > /dev/null
    cmake --build "$work/b" -j 2 > /dev/null
    run "$work/b/consumer"
    ;;
  plain)
    "${compile[@]}" -std=c++17 $opt -fopenmp -I "$src/include" -I /usr/include/eigen3 -c "$here/main.cpp" -o "$work/plain.o"
    "$mpicxx" -fopenmp "$work/plain.o" -o "$work/plain" -ldnnl
    run "$work/plain"
    ;;
  *) echo "unknown way '$way'" >&2; exit 2 ;;
esac
echo "consumed overlap ($way): ok"
