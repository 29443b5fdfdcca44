#!/usr/bin/env bash
# `make asan`: the MPI suites built with AddressSanitizer and
# UndefinedBehaviorSanitizer, run at the ranks the build was configured
# with (make asan: 3); any report fails the run
# (UBSan does not recover, ASan and LeakSanitizer exit non-zero).
# tests/system/lsan.supp lists the leaks suppressed, all inside Open MPI or oneDNN.
set -euo pipefail
build=${1:?usage: asan.sh ASAN_BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI's memory hooks patch malloc; ASan owns it here.
export OMPI_MCA_memory=^patcher
# Full unwinding: Open MPI is built without frame pointers, and the
# suppressions match its libraries by name anywhere in the allocation stack.
export ASAN_OPTIONS="detect_leaks=1 fast_unwind_on_malloc=0 abort_on_error=0 exitcode=67 strict_string_checks=1 detect_stack_use_after_return=1"
export LSAN_OPTIONS="suppressions=$here/lsan.supp print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1 exitcode=68"
cd "$build"
# Not the 8-rank runs of
# the mesh and two-level suites (their 6-rank runs take the same paths;
# CI's time goes to sanitized ranks four to a core there).
ctest -L '^mpi$' -E '\.8ranks$' --output-on-failure -j 2
echo "asan: no error reported"
