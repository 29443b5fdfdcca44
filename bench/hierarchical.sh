#!/usr/bin/env bash
# The hierarchical (two-level) schedules of all_gather_matmul (lhs_rows) and
# matmul_reduce_scatter (rows) against the flat ring (ranks in node order)
# and bulk, on emulated clusters whose nodes host several ranks: 2 nodes x 2
# ranks and 4 nodes x 2 ranks, star at 1 Gbit/s, tcp between nodes and shared
# memory inside, ranks placed by node (mpirun's default). M = K = 2048,
# N = 2048, f32; the strategies interleaved, under the progress thread and the
# poll policy, over ROUNDS runs; JSON lines to OUT.
#
#   bench/hierarchical.sh BENCH VCLUSTER OUT [ROUNDS] [ITERS]
set -uo pipefail
bench=${1:?usage: hierarchical.sh BENCH VCLUSTER OUT [ROUNDS] [ITERS]}
vc=${2:?usage: hierarchical.sh BENCH VCLUSTER OUT [ROUNDS] [ITERS]}
trap '"$vc" down >/dev/null 2>&1' EXIT  # the cluster this script brings up, on every exit
out=${3:?usage: hierarchical.sh BENCH VCLUSTER OUT [ROUNDS] [ITERS]}
rounds=${4:-3}
iters=${5:-5}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# The build's MPI stack (tools/mpi/stack): its launcher, flags and
# environment, and VCLUSTER_MPI for the emulated cluster.
# shellcheck source=tools/mpi/stack
source "$(dirname "$0")/../tools/mpi/stack"
mpi_stack_setup "" "$(cd "$(dirname "$bench")/.." && pwd)" || exit 1
rm -f "$out"
for nodes in 2 4; do
  "$vc" up --nodes "$nodes" --slots 2 --rate 1gbit --topology star >&2 || exit 1
  export OVERLAP_TRANSPORT="tcp between $nodes emulated nodes (star, 1 Gbit/s), shared memory inside; 2 ranks per node"
  for ((round = 1; round <= rounds; round++)); do
    for progress in thread poll; do
      for op in ag rs; do
        echo "[${nodes}x2] round $round, progress $progress: $op bulk, ring, hierarchical" >&2
        OVERLAP_PROGRESS=$progress "$vc" run -np $((2 * nodes)) "$bench" --op $op -m 2048 -k 2048 -n 2048 \
          --strategies ring,hierarchical --no-peers --iters "$iters" --json "$out" > /dev/null || exit 1
      done
    done
  done
done
