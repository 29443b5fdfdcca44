#!/usr/bin/env bash
# Runs every public-header program (tests/CMakeLists.txt, "Every public
# header alone"): each returns at once; building them was the test, and
# this counts them and shows that each one linked and starts.
set -u
n=0 failed=0
for program in "$@"; do
  n=$((n + 1))
  if ! "$program"; then
    echo "public_headers_alone: $program failed to start (exit $?)" >&2
    failed=$((failed + 1))
  fi
done
echo "public_headers_alone: $n programs, $failed failed"
[ "$n" -gt 0 ] && [ "$failed" -eq 0 ]
