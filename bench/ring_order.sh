#!/usr/bin/env bash
# The ring's order on round-robin placement: 2 emulated nodes x 2 ranks
# (star, 1 Gbit/s), ranks placed round-robin (vcluster run --map-by node, as
# mpirun --map-by node or srun -m cyclic would), so rank order crosses the
# network at every hop and the order by node (OVERLAP_RING_ORDER=node, the
# default) at every other. Both ops' balanced shapes, ring against bulk,
# under the progress thread (sleeping 100 us, the default, and 1000 us) and
# the poll policy, the two orders interleaved over ROUNDS runs; JSON lines to
# OUT.
#
#   bench/ring_order.sh BENCH VCLUSTER OUT [ROUNDS] [ITERS]
set -uo pipefail
bench=${1:?usage: ring_order.sh BENCH VCLUSTER OUT [ROUNDS] [ITERS]}
vc=${2:?usage: ring_order.sh BENCH VCLUSTER OUT [ROUNDS] [ITERS]}
trap '"$vc" down >/dev/null 2>&1' EXIT  # the cluster this script brings up, on every exit
out=${3:?usage: ring_order.sh BENCH VCLUSTER OUT [ROUNDS] [ITERS]}
rounds=${4:-3}
iters=${5:-5}
rm -f "$out"
# The build's MPI stack (tools/mpi/stack): VCLUSTER_MPI for the emulated cluster.
# shellcheck source=tools/mpi/stack
source "$(dirname "$0")/../tools/mpi/stack"
mpi_stack_setup "" "$(cd "$(dirname "$bench")/.." && pwd)" || exit 1
"$vc" up --nodes 2 --slots 2 --rate 1gbit --topology star >&2 || exit 1
export OVERLAP_TRANSPORT="tcp between 2 emulated nodes (star, 1 Gbit/s), shared memory inside; 2 ranks per node, placed round-robin"
for ((round = 1; round <= rounds; round++)); do
  for setting in thread:100 thread:1000 poll:4; do
    for order in rank node; do
      for op in "ag -m 2048 -k 2048 -n 2048" "rs -m 2048 -n 2048 -k 2048"; do
        echo "[2x2 round-robin] round $round, progress $setting, OVERLAP_RING_ORDER=$order: ${op}" >&2
        # shellcheck disable=SC2086
        OVERLAP_PROGRESS=${setting%%:*} OVERLAP_PROGRESS_INTERVAL_US=${setting#*:} OVERLAP_POLL_CHUNKS=${setting#*:} \
          OVERLAP_RING_ORDER=$order "$vc" run -np 4 --map-by node "$bench" --op $op \
          --strategies ring --no-peers --iters "$iters" --json "$out" > /dev/null || exit 1
      done
    done
  done
done
