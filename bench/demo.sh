#!/usr/bin/env bash
# The demo behind `make demo`: all_gather_matmul at 2 ranks, bulk vs ring vs
# the limit max(compute only, comm only), and what automatic chooses (its cost
# model measures the links and GEMMs on the first call, about 1-2 s). On an emulated 2-node cluster
# (network namespaces, 1 Gbit/s links) when this machine allows it (root, the
# tbf qdisc); otherwise on shared memory, where there is nothing to hide.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: demo.sh BUILD_DIR}
bench="$build/apps/overlap-bench"
# Bulk against the ring (at 2 ranks bidirectional runs the same schedule) and
# the library's own choice.
args=(--op ag --variant lhs_rows -m 2048 -n 2048 -k 2048 --iters 5 --no-peers --strategies ring,automatic)
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

if reason=$("$here/../tools/vcluster/vcluster" check 2>&1); then
  export VCLUSTER_PREFIX=ovldemo VCLUSTER_STATE=/tmp/overlap-vcluster-demo.$$
  trap '"$here/../tools/vcluster/vcluster" down >/dev/null 2>&1' EXIT
  "$here/../tools/vcluster/vcluster" up --nodes 2 --rate 1gbit --topology star || exit 1
  echo "Two emulated nodes joined by a 1 Gbit/s link (TCP); one core each for compute."
  OVERLAP_TRANSPORT="tcp, emulated 2-node star at 1 Gbit/s" \
    "$here/../tools/vcluster/vcluster" run -np 2 "$bench" "${args[@]}" 2> >(grep -v setpgid >&2)
else
  echo "Cannot emulate a cluster here (${reason#vcluster: }): running on shared memory."
  echo "There the MPI copy uses the same cores as the GEMMs, so expect ring ~ bulk, not a gain."
  OVERLAP_TRANSPORT="shared memory" mpirun -np 2 --oversubscribe --bind-to none "$bench" "${args[@]}"
fi
