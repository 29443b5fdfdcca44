#!/usr/bin/env bash
# The same runs under each MPI stack (tools/mpi/stack), on the emulated 2-node
# star at 1 Gbit/s (tools/vcluster), one stack after the other in one run:
#   - overlap-bench f32 2048^3, both ops (all_gather_matmul lhs_rows,
#     matmul_reduce_scatter rows): compute only, comm only, bulk, ring and
#     automatic;
#   - overlap-layer's training step (its default block, f32): bulk, ring and
#     automatic.
# JSON lines to OUT/stacks.jsonl (the stack in "transport");
# bench/stacks_report.py turns them into docs/results.md's table.
#
#   bench/stacks.sh OPENMPI_BUILD MPICH_BUILD OUT [ITERS] [STEPS]
#
# OPENMPI_BUILD serves both Open MPI stacks (ob1 and UCX differ at run time
# only); MPICH_BUILD is a build with MPICH (make build MPI=mpich). One rank
# per emulated node, one thread per rank: 2 ranks on this machine's cores.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage="usage: stacks.sh OPENMPI_BUILD MPICH_BUILD OUT [ITERS] [STEPS]"
ompi=$(cd "${1:?$usage}" && pwd)
mpich=$(cd "${2:?$usage}" && pwd)
out=${3:?$usage}
iters=${4:-5}
steps=${5:-3}
vc="$here/../tools/vcluster/vcluster"
reason=$("$vc" check 2>&1) || { echo "stacks.sh: cannot emulate a cluster here: ${reason#vcluster: }" >&2; exit 1; }
export VCLUSTER_PREFIX=ovlstacks VCLUSTER_STATE=/tmp/overlap-vcluster-stacks.$$
trap '"$vc" down >/dev/null 2>&1' EXIT
mkdir -p "$out"
rm -f "$out/stacks.jsonl"
"$vc" up --nodes 2 --rate 1gbit --topology star >&2 || exit 1
export OMP_NUM_THREADS=1
for stack in openmpi openmpi-ucx mpich; do
  build=$ompi
  [ "$stack" = mpich ] && build=$mpich
  export OVERLAP_TRANSPORT="tcp, emulated 2-node star, 1 Gbit/s per link, $stack"
  for op in "ag --variant lhs_rows" "rs --variant rows"; do
    echo "[$stack] overlap-bench --op $op 2048^3" >&2
    # shellcheck disable=SC2086
    VCLUSTER_MPI=$stack "$vc" run -np 2 "$build/apps/overlap-bench" --op $op -m 2048 -n 2048 -k 2048 \
      --strategies ring,automatic --no-peers --iters "$iters" --warmup 1 --json "$out/stacks.jsonl" >&2 || exit 1
  done
  echo "[$stack] overlap-layer f32: bulk, ring, automatic; $steps steps" >&2
  VCLUSTER_MPI=$stack "$vc" run -np 2 "$build/apps/overlap-layer" --modes ring,automatic --steps "$steps" \
    --json "$out/stacks.jsonl" >&2 || exit 1
done
