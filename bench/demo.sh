#!/usr/bin/env bash
# The demo behind `make demo`: all_gather_matmul at 2 ranks, bulk vs ring vs
# the limit max(compute only, comm only). On an emulated 2-node cluster
# (network namespaces, 1 Gbit/s links) when this machine allows it (root, the
# tbf qdisc); otherwise on shared memory, where there is nothing to hide.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: demo.sh BUILD_DIR}
bench="$build/apps/overlap-bench"
args=(--op ag --variant lhs_rows -m 2048 -n 2048 -k 2048 --iters 5 --no-peers)
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

can_emulate() {
  [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null && command -v tc >/dev/null || return 1
  local probe=ovl-demo-probe-$$ ok=1
  ip netns add "$probe" 2>/dev/null || return 1
  ip netns exec "$probe" ip link add ovl-p0 type veth peer name ovl-p1 2>/dev/null &&
    ip netns exec "$probe" tc qdisc add dev ovl-p0 root tbf rate 1gbit burst 256kb latency 50ms 2>/dev/null && ok=0
  ip netns delete "$probe"
  return $ok
}

if can_emulate; then
  export VCLUSTER_PREFIX=ovldemo VCLUSTER_STATE=/tmp/overlap-vcluster-demo.$$
  trap '"$here/vcluster/vcluster" down >/dev/null 2>&1' EXIT
  "$here/vcluster/vcluster" up --nodes 2 --rate 1gbit --topology star || exit 1
  echo "Two emulated nodes joined by a 1 Gbit/s link (TCP); one core each for compute."
  OVERLAP_TRANSPORT="tcp, emulated 2-node star at 1 Gbit/s" \
    "$here/vcluster/vcluster" run -np 2 "$bench" "${args[@]}" 2> >(grep -v setpgid >&2)
else
  echo "Cannot emulate a cluster here (needs root and the tbf qdisc): running on shared memory."
  echo "There the MPI copy uses the same cores as the GEMMs, so expect ring ~ bulk, not a gain."
  OVERLAP_TRANSPORT="shared memory" mpirun -np 2 --oversubscribe --bind-to none "$bench" "${args[@]}"
fi
