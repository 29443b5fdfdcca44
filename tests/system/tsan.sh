#!/usr/bin/env bash
# `make tsan`: runs the ThreadSanitizer build of the engine, progress, started-op and layer tests
# and fails on any report (halt_on_error makes the process exit non-zero).
set -euo pipefail
build=${1:?usage: tsan.sh TSAN_BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 suppressions=$here/tsan.supp"
run() { mpiexec -np "$1" --oversubscribe --bind-to none -x TSAN_OPTIONS -x OMP_NUM_THREADS "${@:2}"; }
run 1 "$build/tests/backend_test" --gtest_filter='ring_engine.*'
# The progress thread with both strategies and both ops, sleeping and yielding.
run 3 "$build/tests/progress_test" --gtest_filter='*thread*'
run 2 "$build/tests/progress_test" --gtest_filter='*thread_yield*'
# Started ops: the worker thread runs the ring (with the progress thread)
# while the caller computes, checks the context, or runs another context.
run 2 "$build/tests/start_test" --gtest_filter='start.every_variant_and_schedule_f32:start.one_op*:start.another*:start.an_unwaited*'
# The transformer block: weight-gradient GEMMs on the caller's thread (the
# layer's own backend) while started ops run on the worker thread.
run 2 "$build/tests/transformer_test" --gtest_filter='transformer.f32*'
echo "tsan: no data race reported"
