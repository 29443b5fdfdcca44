#!/usr/bin/env bash
# A failure must end an MPI job quickly and everywhere (tests/system/faults/fault_driver.cpp):
#  1. a GEMM failing inside a ring on the last rank, OVERLAP_ON_FATAL=abort
#     (the default), at 2-5 ranks: the job exits non-zero within 10 s and the
#     message names the op, the step and the ring neighbours;
#  2. the same under OVERLAP_ON_FATAL=throw with the watchdog at 2 s, at 2-5
#     ranks: every rank catches an overlap::error (the failing one its own,
#     the others the watchdog's) within timeout + 10 s;
#  3. a rank that never calls, watchdog at 2 s, abort policy, at 2 and 3
#     ranks: the others report what they waited for and the job ends within
#     timeout + 10 s;
#  4. a rank stalling inside a ring (progress thread, poll, none) or before
#     a bulk collective, watchdog at 2 s: the others name what they waited
#     for and the job ends within timeout + 10 s;
#  5. a rank killed with SIGKILL mid-run at 3 ranks: the launcher exits non-zero
#     within 30 s and no rank process is left.
# Usage: fault_test.sh FAULT_DRIVER
set -uo pipefail
driver=$1
export OMP_NUM_THREADS=1
# The MPI stack of the tests (tools/mpi/stack: its launcher and flags).
source "$(dirname "$0")/../../../tools/mpi/stack"
mpi_stack_setup
mpi=("$MPIEXEC" "${MPI_FLAGS[@]}")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail=0
failed() { echo "FAIL: $*"; fail=1; }
now() { date +%s%3N; }  # milliseconds
# elapsed T0: milliseconds since T0; secs_of MS: "S.mmm"
elapsed() { echo $(($(now) - $1)); }
secs_of() { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }

# run LIMIT NAME [--env VAR=value]... ARGS...: runs the launcher with a hard
# limit, the variables in its environment (every launcher passes them to the
# ranks of its node); sets rc, ms and secs.
run() {
  local limit=$1 name=$2; shift 2
  local vars=()
  while [ "$1" = --env ]; do vars+=("$2"); shift 2; done
  local t0; t0=$(now)
  timeout -k 5 "$limit" env "${vars[@]}" "${mpi[@]}" "$@" >"$out/$name.out" 2>"$out/$name.err"
  rc=$?
  ms=$(elapsed "$t0")
  secs=$(secs_of "$ms")
}
# launch LIMIT NAME ...: run, in the background, its rc and time into
# $out/NAME.res; result NAME (after wait) sets rc, ms and secs from there.
# The watchdog scenarios run at once: each spends its seconds waiting for a
# 2 s watchdog or a lingering rank (43 s in turn, about 10 together).
launch() {
  printf '%q ' "$@" >"$out/$2.args"
  (
    run "$@"
    echo "$rc $ms" >"$out/$2.res"
  ) &
}
# relaunch_silent: a launched job from whose ranks nothing came, neither
# on stdout nor a line of the library's ("overlap: ...") on stderr, never
# ran the driver: its launcher failed (seen once in CI, a job ending after
# 0.5 s with the 11 jobs below starting together on 2 cores). Its
# launcher's stderr is shown and it runs again, alone; the checks then
# judge that run.
relaunch_silent() {
  local f name
  for f in "$out"/*.args; do
    name=$(basename "$f" .args)
    read -r rc ms <"$out/$name.res" || continue
    [ -s "$out/$name.out" ] || grep -q "overlap: " "$out/$name.err" || {
      echo "relaunching $name: its job ended after $ms ms with nothing from any rank; the launcher said:"
      sed 's/^/  /' "$out/$name.err"
      eval "run $(cat "$f")"
      echo "$rc $ms" >"$out/$name.res"
    }
  done
}
result() {
  read -r rc ms <"$out/$1.res" || { rc=255 ms=0; }
  secs=$(secs_of "$ms")
}

for n in 2 3 4 5; do
  run 60 "abort$n" -np "$n" "$driver" ring-fault 1
  grep -q "fatal error on rank $((n - 1)) of $n.*at ring step 2 of .*receives from rank .*sends to rank .*injected at ring step 2; OVERLAP_ON_FATAL=abort" \
    "$out/abort$n.err" || failed "abort at $n ranks: message missing: $(head -c 600 "$out/abort$n.err")"
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || failed "abort at $n ranks: exit code $rc"
  ((ms < (10) * 1000)) || failed "abort at $n ranks took $secs s"
  echo "ring fault, abort policy, $n ranks: exit $rc after $secs s"
done

for n in 2 3 4 5; do
  launch 60 "throw$n" --env OVERLAP_ON_FATAL=throw --env OVERLAP_TIMEOUT_S=2 --env FAULT_LINGER_S=5 -np "$n" "$driver" ring-fault 1
done
for n in 2 3; do
  launch 60 "absent$n" --env OVERLAP_TIMEOUT_S=2 -np "$n" "$driver" absent 40
done
# A rank stalling inside a ring (every progress policy) or before a bulk
# collective: the others' watchdog names what they waited for. The stall is
# in the first step's GEMM, before the rank forwards anything: a later stall
# need not hold its peers up, since the progress thread moves the transfers
# it posted before it stalled.
for policy in thread poll none; do
  launch 60 "stall-$policy" --env OVERLAP_TIMEOUT_S=2 --env OVERLAP_PROGRESS=$policy -np 3 "$driver" ring-stall 0 40
done
# The last of 3 ranks sleeps 40 s before MODE's transfers; the 2 s watchdog
# must end the job.
for mode in bulk-stall others-stall; do
  launch 60 "$mode" --env OVERLAP_TIMEOUT_S=2 -np 3 "$driver" "$mode" 40
done
wait
relaunch_silent

for n in 2 3 4 5; do
  result "throw$n"
  for ((r = 0; r < n; ++r)); do
    grep -q "^rank $r caught: overlap: " "$out/throw$n.out" ||
      failed "throw at $n ranks: rank $r did not catch: $(cat "$out/throw$n.out") (stderr: $(head -c 600 "$out/throw$n.err"))"
  done
  grep -q "^rank $((n - 1)) caught: .*injected at ring step 2" "$out/throw$n.out" ||
    failed "throw at $n ranks: the failing rank's error"
  [ "$(grep -c "caught: .*watchdog" "$out/throw$n.out")" -eq $((n - 1)) ] ||
    failed "throw at $n ranks: not every peer reported the watchdog"
  ((ms < (2 + 10 + 5) * 1000)) || failed "throw at $n ranks took $secs s"
  echo "ring fault, throw policy + 2 s watchdog, $n ranks: every rank caught its error; job ended after $secs s"
done
sed 's/^/  /' "$out/throw3.out"

for n in 2 3; do
  result "absent$n"
  grep -q "watchdog: overlap::all_gather_matmul.*waited more than 2 s" "$out/absent$n.err" ||
    failed "absent rank at $n ranks: no watchdog message: $(head -c 600 "$out/absent$n.err")"
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || failed "absent rank at $n ranks: exit code $rc"
  ((ms < (2 + 10) * 1000)) || failed "absent rank at $n ranks took $secs s"
  echo "absent rank, 2 s watchdog, $n ranks: exit $rc after $secs s; message:"
  grep -m1 "watchdog" "$out/absent$n.err" | sed 's/^/  /'
done

for policy in thread poll none; do
  result "stall-$policy"
  grep -q "watchdog: overlap::all_gather_matmul.*ring.*waited more than 2 s before step [0-9]* for .*bytes .* rank [0-9] on lane 0" \
    "$out/stall-$policy.err" || failed "ring stall ($policy): no watchdog message: $(head -c 800 "$out/stall-$policy.err")"
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || failed "ring stall ($policy): exit code $rc"
  ((ms < (2 + 10) * 1000)) || failed "ring stall ($policy) took $secs s"
  echo "rank stalled in a ring, progress $policy, 2 s watchdog, 3 ranks: exit $rc after $secs s"
done
grep -m1 "watchdog" "$out/stall-thread.err" | sed 's/^/  /'
# stalled MODE PATTERN WHAT: MODE's job must have ended through the
# watchdog, with a message matching PATTERN.
stalled() {
  local mode=$1 pattern=$2 what=$3
  result "$mode"
  grep -q "$pattern" "$out/$mode.err" || failed "$mode: no watchdog message: $(head -c 800 "$out/$mode.err")"
  ((ms < (2 + 10) * 1000)) || failed "$mode took $secs s"
  echo "rank stalled before $what, 2 s watchdog, 3 ranks: exit $rc after $secs s"
  grep -m1 "watchdog" "$out/$mode.err" | sed 's/^/  /'
}
stalled bulk-stall "watchdog: overlap::all_gather_matmul.*bulk.*waited more than 2 s in MPI_Allgatherv" \
  "a bulk all-gather"
stalled others-stall "watchdog: overlap::all_gather_matmul.*moving the other operands" \
  "the other-operands algorithm's transfers"

# SIGKILL one rank of three mid-run.
"${mpi[@]}" -np 3 "$driver" loop 60 >"$out/kill.out" 2>"$out/kill.err" &
launcher=$!
for _ in $(seq 100); do [ "$(grep -c running "$out/kill.out")" -eq 3 ] && break; sleep 0.1; done
pids=$(awk '/running/ {print $4}' "$out/kill.out")
victim=$(awk '/^rank 1 pid/ {print $4}' "$out/kill.out")
if [ -z "$victim" ]; then
  failed "kill: ranks did not start"
  kill "$launcher" 2>/dev/null
else
  sleep 1
  t0=$(now)
  kill -9 "$victim"
  for _ in $(seq 300); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
  secs=$(secs_of "$(elapsed "$t0")")
  if kill -0 "$launcher" 2>/dev/null; then failed "kill: the launcher still running after 30 s"; kill "$launcher"; fi
  wait "$launcher"; rc=$?
  [ "$rc" -ne 0 ] || failed "kill: the launcher exited 0"
  # The other ranks are ended by the launcher; give them until 30 s after
  # the kill to be gone (zombies awaiting their parent count as gone).
  alive() {
    local l=""
    for p in $pids; do
      st=$(ps -o stat= -p "$p" 2>/dev/null) && [ "${st:0:1}" != Z ] && l="$l $p"
    done
    echo "$l"
  }
  for _ in $(seq 300); do [ -z "$(alive)" ] && break; (($(elapsed "$t0") > 30000)) && break; sleep 0.1; done
  gone=$(secs_of "$(elapsed "$t0")")
  left=$(alive)
  [ -z "$left" ] || { failed "kill: rank processes left behind 30 s after the kill:$left"; kill -9 $left; }
  echo "SIGKILL of rank 1 of 3 ($MPI_STACK): the launcher exited $rc after $secs s; every rank process gone after $gone s"
fi

[ "$fail" -eq 0 ] && echo "fault tests: all passed"
exit "$fail"
