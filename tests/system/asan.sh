#!/usr/bin/env bash
# `make asan`: the MPI suites built with AddressSanitizer and
# UndefinedBehaviorSanitizer, run at the ranks the build was configured
# with (make asan: 3, and the suites' 6-rank runs); any report fails the run
# (UBSan does not recover, ASan and LeakSanitizer exit non-zero).
# tests/system/lsan.supp lists the leaks suppressed, all inside Open MPI,
# oneDNN or glibc on their behalf.
set -euo pipefail
build=${1:?usage: asan.sh ASAN_BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI's memory hooks patch malloc; ASan owns it here.
export OMPI_MCA_memory=^patcher
# The fast (frame-pointer) unwinder on malloc: our code keeps its frame
# pointers (-fno-omit-frame-pointer), so its stacks are whole; Open MPI's
# allocations are named by their first frame, the library or component that
# made them, which keep_modules.cpp keeps mapped until the leak check. The
# slow unwinder walked every stack in full at each malloc: ag_test took 25 s
# at 3 ranks instead of 8, the soak test 51 s instead of 6.
shim="$(cd "$build" && pwd)/tests/libkeep_modules.so"
mkdir -p "$build/tests"
"${SHIM_CXX:-c++}" -shared -fPIC -O2 -o "$shim" "$here/keep_modules.cpp"
export ASAN_OPTIONS="detect_leaks=1 fast_unwind_on_malloc=1 abort_on_error=0 exitcode=67 strict_string_checks=1 detect_stack_use_after_return=1"
export LSAN_OPTIONS="suppressions=$here/lsan.supp print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1 exitcode=68"
cd "$build"
# Not the 8-rank runs of the mesh and two-level suites (their 6-rank runs
# take the same paths; CI's time goes to sanitized ranks four to a core
# there). The launcher and the ranks preload the shim (Clang links the
# sanitizer runtime into each program, so nothing else need come first).
LD_PRELOAD="$shim${LD_PRELOAD:+ $LD_PRELOAD}" ctest -L '^mpi$' -E '\.8ranks$' --output-on-failure -j 2
echo "asan: no error reported"
