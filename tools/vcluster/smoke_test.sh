#!/usr/bin/env bash
# CI smoke test of the emulated cluster, twice: 2 nodes of one rank (star,
# 1 Gbit/s), then 2 nodes of 2 ranks each (--slots 2: shared memory inside a
# node, TCP between nodes). Both ops are checked across the namespaces (the
# tensor-parallel MLP example verifies itself); with slots, each rank must
# see its node's ranks as its shared-memory group (MPI_COMM_TYPE_SHARED, what
# the library's node detection uses) and ranks must fill node0 first; placed
# round-robin (--map-by node), the context's ring must still keep each
# node's ranks together (0,2,1,3) and both ops must stay exact. Then
# down: nothing of ours left behind, nothing that is not ours removed.
# Across the first cluster, overlap-bench checks the ops whose pieces land
# strided in c or gathered_out, and batches, at sizes whose messages exceed
# 1 MB (Open MPI 4.1's TCP path corrupted such messages when received into a
# strided type; the library now receives every piece into one contiguous
# block). No timing asserted. Exit 77
# (skipped) with a reason where the machine forbids namespaces or tbf.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prog=${1:?usage: smoke_test.sh PROGRAM NODE_PROBE [BENCH]}
probe=${2:?usage: smoke_test.sh PROGRAM NODE_PROBE [BENCH]}
bench=${3:-}  # overlap-bench; without it (apps not built) its checks are left out, saying so
vc="$here/vcluster"
# A prefix of its own, so a vcluster someone has up is left alone.
export VCLUSTER_PREFIX=ovlsmoke VCLUSTER_STATE=/tmp/overlap-vcluster-smoke.$$

# The tests' MPI stack (tools/mpi/stack) is the emulated cluster's.
export VCLUSTER_MPI=${VCLUSTER_MPI:-${OVERLAP_MPI_STACK:-openmpi}}
reason=$("$vc" check 2>&1) || { echo "SKIPPED: ${reason#vcluster: }"; exit 77; }

# Two namespaces that only start with the prefix (another cluster's, whose
# prefix extends ours, and someone's own): `down` must leave them alone.
# Removed on exit only if this test made them.
bystanders="$VCLUSTER_PREFIX-x$$-sw $VCLUSTER_PREFIX-keep$$"
made=""
trap '"$vc" down >/dev/null 2>&1; for ns in $made; do ip netns delete "$ns" 2>/dev/null; done' EXIT
fail() { echo "vcluster smoke test: $*"; exit 1; }

"$vc" up --nodes 2 --rate 1gbit --topology star || exit 1
OMP_NUM_THREADS=1 timeout 120 "$vc" run -np 2 "$prog" || fail "the run across 2 nodes failed"
if [ -z "$bench" ]; then
  echo "vcluster smoke test: no overlap-bench given, the strided layouts over TCP are not checked"
else
  for args in "--op rs --variant cols" "--op ag --variant lhs_cols" "--op rs --variant rows --batch 2" \
    "--op ag --variant rhs_rows --batch 2"; do
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=1 timeout 120 "$vc" run -np 2 "$bench" $args -m 2048 -n 2048 -k 2048 --strategies ring \
      --no-peers --iters 1 --warmup 0 > /dev/null || fail "overlap-bench $args: wrong result (or failed) over TCP"
  done
  # A report names the emulated cluster, not the single machine it runs on.
  label=$(env -u OVERLAP_TRANSPORT OMP_NUM_THREADS=1 timeout 120 "$vc" run -np 2 "$bench" --op ag -m 64 -n 64 -k 64 --strategies ring \
    --iters 1 --warmup 0 | sed -n 's/.*transport: //p')
  [ "$label" = "emulated TCP cluster (tools/vcluster): 2-node star, 1gbit per link, $VCLUSTER_MPI" ] ||
    fail "overlap-bench's transport over vcluster: '$label'"
fi

"$vc" up --nodes 2 --slots 2 --rate 1gbit --topology star || exit 1
# Placement: ranks 0,1 on node0 and 2,3 on node1 (by slot).
hosts=$(timeout 60 "$vc" run -np 4 sh -c 'echo "${OMPI_COMM_WORLD_RANK:-$PMI_RANK} $(hostname)"' | sort -n | awk '{print $2}' | tr '\n' ' ')
[ "$hosts" = "node0 node0 node1 node1 " ] || fail "ranks by node: '$hosts', want 'node0 node0 node1 node1'"
groups=$(timeout 60 "$vc" run -np 4 "$probe" | sort -k2 -n | tr '\n' ';')
want=""
for r in 0 1 2 3; do want="${want}rank $r node_ranks 2 one_node 0 nodes 2 ring 0,1,2,3;"; done
[ "$groups" = "$want" ] || fail "node groups: '$groups', want '$want'"
OMP_NUM_THREADS=1 timeout 120 "$vc" run -np 4 "$prog" || fail "the run across 2 nodes x 2 slots failed"
# Round-robin placement: node0 holds ranks 0 and 2; the ring goes 0,2,1,3.
hosts=$(timeout 60 "$vc" run -np 4 --map-by node sh -c 'echo "${OMPI_COMM_WORLD_RANK:-$PMI_RANK} $(hostname)"' | sort -n | awk '{print $2}' | tr '\n' ' ')
[ "$hosts" = "node0 node1 node0 node1 " ] || fail "ranks round-robin: '$hosts', want 'node0 node1 node0 node1'"
groups=$(timeout 60 "$vc" run -np 4 --map-by node "$probe" | sort -k2 -n | tr '\n' ';')
want=""
for r in 0 1 2 3; do want="${want}rank $r node_ranks 2 one_node 0 nodes 2 ring 0,2,1,3;"; done
[ "$groups" = "$want" ] || fail "ring by node: '$groups', want '$want'"
OMP_NUM_THREADS=1 timeout 120 "$vc" run -np 4 --map-by node "$prog" || fail "the round-robin run failed"

for ns in $bystanders; do
  ip netns add "$ns" || fail "cannot create the namespace $ns"
  made="$made $ns"
done
"$vc" down
for ns in $bystanders; do
  ip netns list | awk '{print $1}' | grep -qx "$ns" || fail "down removed $ns, which up did not create"
done
for ns in $made; do ip netns delete "$ns"; done
made=""
left=$(ip netns list | awk '{print $1}' | grep "^$VCLUSTER_PREFIX-" || true)
[ -z "$left" ] || fail "left behind: $left"
echo "vcluster smoke test: ok (2 nodes, and 2 nodes x 2 slots; star, tcp between nodes)"
