#!/usr/bin/env bash
# `make bench`: sweeps both ops from compute-bound to comm-bound shapes on the
# emulated cluster (2 nodes star at 1 Gbit/s, 4 nodes ring at 1 Gbit/s) when
# the machine can emulate one, and on shared memory; measures every progress
# policy on the balanced shapes and the per-step GEMM efficiency; then writes
# docs/results.md (the issue-5 targets P1-P5 first, then tables and plots in
# docs/results/*.svg) and keeps the JSON in docs/results/.
#
#   bench/sweep.sh BUILD_DIR [--quick]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:?usage: sweep.sh BUILD_DIR [--quick]}
quick=${2:-}
bench="$(cd "$build" && pwd)/apps/overlap-bench"
engine="$(cd "$build" && pwd)/bench/overlap-engine-bench"
probe="$(cd "$build" && pwd)/bench/overlap-link-probe"
out="$root/docs/results"
mkdir -p "$out"
export OMP_NUM_THREADS=1
# The build's MPI stack (tools/mpi/stack): its launcher, flags and
# environment, and VCLUSTER_MPI for the emulated cluster.
# shellcheck source=tools/mpi/stack
source "$root/tools/mpi/stack"
mpi_stack_setup "" "$(cd "$build" && pwd)" || exit 1
iters=7
reps=9
p3_iters=5
sizes="256 512 1024 2048 2560 4096"
shm_sizes="1024 2048"
[ "$quick" = --quick ] && sizes="256 2048" && shm_sizes=2048 && iters=3 && reps=3 && p3_iters=2

# sweep NAME SIZES LAUNCHER...: AG (lhs_rows) over N and RS (rows) over K,
# M = 2048, with bulk, ring, bidirectional and the peers side by side.
sweep() {
  local name=$1 list=$2; shift 2
  local json="$out/$name.jsonl" s
  rm -f "$json"
  for s in $list; do
    echo "[$name] all_gather_matmul lhs_rows  M=2048 K=2048 N=$s" >&2
    "$@" "$bench" --op ag --variant lhs_rows -m 2048 -k 2048 -n "$s" --iters $iters --json "$json" > /dev/null || return 1
    echo "[$name] matmul_reduce_scatter rows  M=2048 N=2048 K=$s" >&2
    "$@" "$bench" --op rs --variant rows -m 2048 -n 2048 -k "$s" --iters $iters --json "$json" > /dev/null || return 1
  done
}

# policies NAME LAUNCHER...: the balanced shapes (N = 2048, K = 2048) under
# every progress policy setting, ring strategy, for the default's choice.
policies() {
  local name=$1; shift
  local json="$out/$name-policies.jsonl" setting
  rm -f "$json"
  for setting in thread:100 thread:1000 thread:0 poll:2 poll:4 none:0; do
    echo "[$name] progress ${setting%%:*} (${setting#*:})" >&2
    local env=(OVERLAP_PROGRESS="${setting%%:*}")
    case $setting in
      thread:*) env+=(OVERLAP_PROGRESS_INTERVAL_US="${setting#*:}") ;;
      poll:*) env+=(OVERLAP_POLL_CHUNKS="${setting#*:}") ;;
    esac
    env "${env[@]}" "$@" "$bench" --op ag -m 2048 -k 2048 -n 2048 --strategies ring --no-peers --iters $iters \
      --json "$json" > /dev/null || return 1
    env "${env[@]}" "$@" "$bench" --op rs -m 2048 -n 2048 -k 2048 --strategies ring --no-peers --iters $iters \
      --json "$json" > /dev/null || return 1
  done
}

runs=()
if reason=$("$here/../tools/vcluster/vcluster" check 2>&1); then
  vc="$here/../tools/vcluster/vcluster"
  export VCLUSTER_PREFIX=ovlbench VCLUSTER_STATE=/tmp/overlap-vcluster-bench.$$
  trap '"$vc" down >/dev/null 2>&1' EXIT
  "$vc" up --nodes 2 --rate 1gbit --topology star >&2 || exit 1
  export OVERLAP_TRANSPORT="tcp, emulated 2-node star, 1 Gbit/s"
  sweep star2 "$sizes" "$vc" run -np 2 || exit 1
  policies star2 "$vc" run -np 2 || exit 1
  # Per-step trace of the balanced cases: how long GEMM steps take while
  # transfers are outstanding against steps with none (the cores also move
  # the data on this machine).
  echo "[star2] per-step trace (OVERLAP_VERBOSE=2) of the balanced shapes" >&2
  for op in "ag -m 2048 -k 2048 -n 2048" "rs -m 2048 -n 2048 -k 2048"; do
    # shellcheck disable=SC2086
    OVERLAP_VERBOSE=2 "$vc" run -np 2 "$bench" --op $op --strategies ring --no-peers --iters 3 2>&1 >/dev/null |
      grep "^overlap: ring step" | sed "s/^/${op%% *} /"
  done > "$out/star2-trace.txt" || exit 1
  runs+=(star2)
  # The balanced shapes again with oneDNN capped at AVX2 (the CPUs most
  # clusters have; issue 11's P2).
  rm -f "$out/star2-avx2.jsonl"
  for op in "ag -m 2048 -k 2048 -n 2048" "rs -m 2048 -n 2048 -k 2048"; do
    echo "[star2] ISA AVX2: ${op}" >&2
    # shellcheck disable=SC2086
    "$vc" run -np 2 env ONEDNN_MAX_CPU_ISA=AVX2 "$bench" --op $op --strategies ring --no-peers --iters $iters \
      --json "$out/star2-avx2.jsonl" > /dev/null || exit 1
  done
  "$vc" up --nodes 4 --rate 1gbit --topology ring >&2 || exit 1
  OVERLAP_TRANSPORT="tcp, emulated 4-node ring, 1 Gbit/s per link" sweep ring4 "$sizes" "$vc" run -np 4 || exit 1
  # Bidirectional against one-way on a strongly comm-bound shape (32 MiB
  # shards), and the links' own two-way rate in raw MPI for the same bytes.
  rm -f "$out/ring4-p3.jsonl"
  echo "[ring4] comm-bound: all_gather_matmul M=8192 K=4096 N=256, matmul_reduce_scatter M=8192 N=4096 K=256" >&2
  OVERLAP_TRANSPORT="tcp, emulated 4-node ring, 1 Gbit/s per link" "$vc" run -np 4 "$bench" --op ag -m 8192 -k 4096 \
    -n 256 --no-peers --iters $p3_iters --json "$out/ring4-p3.jsonl" > /dev/null || exit 1
  OVERLAP_TRANSPORT="tcp, emulated 4-node ring, 1 Gbit/s per link" "$vc" run -np 4 "$bench" --op rs -m 8192 -n 4096 \
    -k 256 --no-peers --iters $p3_iters --json "$out/ring4-p3.jsonl" > /dev/null || exit 1
  echo "[ring4] raw MPI ring exchange of 32 MiB, one way and both ways" >&2
  "$vc" run -np 4 "$probe" --bytes $((32 << 20)) --iters $reps --transport "tcp, emulated 4-node ring, 1 Gbit/s per link" \
    > "$out/ring4-link.jsonl" || exit 1
  runs+=(ring4)
  # Issue 15: the ring's order on round-robin placement, 2 nodes x 2 ranks.
  bash "$here/ring_order.sh" "$bench" "$vc" "$out/slots2x2-ring-order.jsonl" $([ "$quick" = --quick ] && echo "1 3") ||
    exit 1
  # Issue 12: the cost model's sweep (2-node star and 4-node ring, 1 and 10 Gbit/s).
  bash "$here/model_sweep.sh" "$build" "$vc" $quick || exit 1
  # Issue 15: the hierarchical schedule on nodes of 2 ranks (2 x 2, 4 x 2).
  bash "$here/hierarchical.sh" "$bench" "$vc" "$out/hierarchical.jsonl" $([ "$quick" = --quick ] && echo "1 3") ||
    exit 1
  # Issue 14: training steps of the transformer block, bulk against decomposed (P8).
  bash "$here/layer.sh" "$build" "$vc" "$out" $([ "$quick" = --quick ] && echo 2) || exit 1
  "$vc" down
else
  echo "cannot emulate a cluster here (${reason#vcluster: }): no TCP figures" >&2
fi
# Shared memory, no emulation: decomposed against bulk where there is
# nothing to overlap (the copies take a core), and the policies there.
export OVERLAP_TRANSPORT="shared memory"
shm=(mpi_run 2)
sweep shm2 "$shm_sizes" "${shm[@]}" || exit 1
policies shm2 "${shm[@]}" || exit 1
runs+=(shm2)
rm -f "$out/shm2-avx2.jsonl"
for op in "ag -m 2048 -k 2048 -n 2048" "rs -m 2048 -n 2048 -k 2048"; do
  echo "[shm2] ISA AVX2: ${op}" >&2
  # shellcheck disable=SC2086
  ONEDNN_MAX_CPU_ISA=AVX2 "${shm[@]}" "$bench" --op $op --strategies ring --no-peers --iters $iters \
    --json "$out/shm2-avx2.jsonl" > /dev/null || exit 1
done
# f32 and bf16 GEMM paths (native, widened) at this ISA and capped at AVX2.
bash "$here/gemm_paths.sh" "$bench" "$out/gemm-paths.jsonl" $iters || exit 1
# P5: ring pieces against one GEMM, alone and with every core computing, at
# this ISA and capped at AVX2, B as stored and packed once per call.
bash "$here/pieces.sh" "$engine" "$out" $reps || exit 1
# The progress thread's cost: the same pieces with and without a thread
# testing a pending request, two ranks at once so that the threads compete
# with GEMMs for the cores as in a ring (each rank writes its own file).
echo "[engine] progress thread cost, 2 ranks" >&2
OMP_NUM_THREADS=1 mpi_run 2 sh -c 'exec "$0" \
  --benchmark_filter="gemm/(pieces/2048/1024/2048/12/0|ring_steps_progress_thread/2048/1024/2048/12/)" \
  --benchmark_repetitions="$1" \
  --benchmark_enable_random_interleaving=true --benchmark_out="$2.${OMPI_COMM_WORLD_RANK:-$PMI_RANK}.json" \
  --benchmark_out_format=json > /dev/null' "$engine" "$reps" "$out/engine-2ranks" || exit 1
python3 "$here/report.py" "$out" "$root/docs/results.md" "${runs[@]}"
# The model's projection to many ranks, from this run's calibration (GEMM rates of one core).
cal="$out/model-star2-10gbit-calibration.json"
[ -f "$cal" ] || { "$(cd "$build" && pwd)/apps/overlap-calibrate" -o "$out/shm1-calibration.json" >&2 && cal="$out/shm1-calibration.json"; }
python3 "$here/scaling.py" "$(cd "$build" && pwd)/bench/overlap-projection" "$cal" "$out" "$root/docs/scaling.md"
