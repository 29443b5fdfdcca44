#!/usr/bin/env bash
# The progress policies side by side under each MPI stack (tools/mpi/stack),
# on the emulated 2-node star at 1 Gbit/s (tools/vcluster), with 1 and 2
# ranks per emulated node, one thread per rank, in one run: overlap-bench f32
# 2048^3, both ops (all_gather_matmul lhs_rows, matmul_reduce_scatter rows),
# the ring under OVERLAP_PROGRESS=automatic, thread, poll and none (bulk,
# compute only and comm only beside each).
# JSON lines to OUT/progress.jsonl (stack and ranks per node in "transport");
# bench/progress_report.py turns them into docs/results.md's table.
#
#   bench/progress.sh OPENMPI_BUILD MPICH_BUILD OUT [ITERS] [ROUNDS]
#
# ROUNDS (default 2) repeats the whole set, interleaved, so that a slow spell
# of this shared machine does not land on one policy; the report takes the
# median over rounds.
#
# OPENMPI_BUILD serves both Open MPI stacks; MPICH_BUILD is a build with
# MPICH and its tests (make build MPI=mpich), whose yield library the
# mpich+yield runs preload.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage="usage: progress.sh OPENMPI_BUILD MPICH_BUILD OUT [ITERS] [ROUNDS]"
ompi=$(cd "${1:?$usage}" && pwd)
mpich=$(cd "${2:?$usage}" && pwd)
out=${3:?$usage}
iters=${4:-5}
rounds=${5:-2}
vc="$here/../tools/vcluster/vcluster"
stack_tool="$here/../tools/mpi/stack"
reason=$("$vc" check 2>&1) || { echo "progress.sh: cannot emulate a cluster here: ${reason#vcluster: }" >&2; exit 1; }
export VCLUSTER_PREFIX=ovlprog VCLUSTER_STATE=/tmp/overlap-vcluster-progress.$$
trap '"$vc" down >/dev/null 2>&1' EXIT
mkdir -p "$out"
[ -n "${PROGRESS_RUNS:-}" ] || rm -f "$out/progress.jsonl"  # a subset adds to a run's lines
"$vc" up --nodes 2 --slots 2 --rate 1gbit --topology star >&2 || exit 1
export OMP_NUM_THREADS=1
# STACK:RANKS_PER_NODE (PROGRESS_RUNS picks some); mpich+yield preloads tools/mpi/stack's yield library
# (MPICH's waiting ranks spin): needed where 4 ranks share 2 cores, and run
# beside plain MPICH at 1 per node to show what the spinning costs.
for ((round = 1; round <= rounds; round++)); do
for run in ${PROGRESS_RUNS:-openmpi:1 openmpi:2 openmpi-ucx:1 openmpi-ucx:2 mpich:1 mpich+yield:1 mpich+yield:2}; do
  label=${run%%:*} per_node=${run#*:}
  stack=${label%+yield}
  build=$ompi
  [ "$stack" = mpich ] && build=$mpich
  map=slot
  [ "$per_node" = 1 ] && map=node
  (
    if [ "$label" = mpich+yield ]; then
      export "$("$stack_tool" env mpich "$build" | grep '^LD_PRELOAD=')"
    fi
    export OVERLAP_TRANSPORT="tcp, emulated 2-node star, 1 Gbit/s per link, $per_node per node, $label"
    for op in "ag --variant lhs_rows" "rs --variant rows"; do
      for policy in automatic thread poll none; do
        echo "[round $round, $label, $per_node per node] overlap-bench --op $op, progress $policy" >&2
        # shellcheck disable=SC2086
        OVERLAP_PROGRESS=$policy VCLUSTER_MPI=$stack "$vc" run -np $((2 * per_node)) --map-by $map \
          "$build/apps/overlap-bench" --op $op -m 2048 -n 2048 -k 2048 --strategies ring --no-peers \
          --iters "$iters" --warmup 1 --json "$out/progress.jsonl" >&2 || exit 1
      done
    done
  ) || exit 1
done
done
