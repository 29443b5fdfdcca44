#!/usr/bin/env bash
# A Slurm cluster of two emulated nodes: the emulated cluster (tools/vcluster,
# 2 nodes x 2 slots, star, 1 Gbit/s) with one slurmd in each node's network
# namespace (its own hostname, node0 and node1) and slurmctld in the switch's.
# The sbatch scripts of slurm/ run unchanged as a user would submit them on a
# real cluster, with 2 nodes x 2 tasks: srun (the PMI of the site's
# MpiDefault, pmix; pmi2 for an MPICH build) and the MPI's own launcher. Checks:
# each rank sees its node's 2 ranks and a context finds 2 nodes with the ring
# keeping each node's ranks together (tests/node_probe), the tensor-parallel
# MLP verifies itself on 4 ranks across the link, the transformer layer trains on a
# dp x tp = 2 x 2 mesh (slurm/layer.sbatch), and the demo runs under both
# launchers, and one rank per node with every CPU of the node (2 OpenMP
# threads bound to its cores). Every daemon is stopped by PID and the namespaces are removed,
# even on failure. Exit 77 (skipped) with the reason where the machine
# cannot (no root, no namespaces or tbf, no Slurm).
set -uo pipefail
src=$(cd "${1:?usage: slurm_multinode_test.sh SOURCE_DIR BUILD_DIR}" && pwd)
build=$(cd "${2:?}" && pwd)
# shellcheck source=tests/system/slurm/lib.sh
source "$(dirname "$0")/lib.sh"

vc="$src/tools/vcluster/vcluster"
reason=$("$vc" check 2>&1) || skip "${reason#vcluster: }"
slurm_install
export VCLUSTER_PREFIX=ovlslurm VCLUSTER_STATE=/tmp/overlap-vcluster-slurm.$$
sw=$VCLUSTER_PREFIX-sw
slurm_dirs
cleanup() {
  slurm_cleanup
  "$vc" down > /dev/null 2>&1
}
trap cleanup EXIT
"$vc" up --nodes 2 --slots 2 --rate 1gbit --topology star || fail "vcluster up"
slurm_start_munge

# on_node NAMESPACE HOST CMD...: CMD in a network namespace under its own
# hostname, with the node's munged at the path slurm.conf names (a private
# mount). nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup
# tree slurmd needs.
on_node() {
  local ns=$1 host=$2; shift 2
  nsenter --net="/run/netns/$ns" unshare --uts --mount sh -c \
    'hostname "$0" && mount --bind "$1" "$2" && shift 2 && exec "$@"' "$host" "$dir/munge-$host" "$dir/munge" "$@"
}
# Clients talk to slurmctld from the switch's namespace.
sl() { ip netns exec "$sw" "$@"; }

cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
{
  echo "ClusterName=overlapmulti"
  echo "SlurmctldHost=ctl(198.18.0.254)"
  echo "SlurmdSpoolDir=$dir/spool/%n"
  echo "SlurmdPidFile=$dir/slurmd-%n.pid"
  echo "SlurmdLogFile=$dir/log/slurmd-%n.log"
  # Each node's own temporary directory (Slurm's PMIx names its per-job
  # directories alike on every node; on one file system they would collide).
  echo "TmpFS=$dir/tmp-%n"
  slurm_conf_common
  echo "NodeName=node0 NodeAddr=198.18.0.1 CPUs=$cpus RealMemory=1000 State=UNKNOWN"
  echo "NodeName=node1 NodeAddr=198.18.0.2 CPUs=$cpus RealMemory=1000 State=UNKNOWN"
  echo "PartitionName=debug Nodes=node0,node1 Default=YES MaxTime=INFINITE State=UP"
} > "$dir/slurm.conf"
export SLURM_CONF="$dir/slurm.conf"
mkdir -p "$dir/spool/node0" "$dir/spool/node1" "$dir/tmp-node0" "$dir/tmp-node1"
nsenter --net="/run/netns/$sw" unshare --uts sh -c 'hostname ctl && exec "$@"' sh slurmctld -D -f "$SLURM_CONF" \
  > "$dir/log/slurmctld.out" 2>&1 &
pids+=($!)
for i in 0 1; do
  slurm_start_munge "$dir/munge-node$i"
  on_node "$VCLUSTER_PREFIX-node$i" "node$i" slurmd -D -N "node$i" -f "$SLURM_CONF" > "$dir/log/slurmd-node$i.out" 2>&1 &
  pids+=($!)
done
slurm_wait_idle 2 sl

# Open MPI between the nodes over the emulated links only (shared memory
# inside a node): what a site's MCA defaults would say for its network.
# MPICH's Hydra (mpirun under a build with MPICH) gives its proxies the
# address of node0's link: the emulated nodes' names resolve nowhere.
# shellcheck disable=SC2054  # the commas are in values (tcp,vader,self)
common_env=(OVERLAP_BUILD="$build" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
            OMPI_MCA_btl=tcp,vader,self OMPI_MCA_btl_tcp_if_include=198.18.0.0/24
            OMPI_MCA_oob_tcp_if_include=198.18.0.0/24 HYDRA_IFACE=ovl-n0)
alloc=(--parsable --nodes=2 --ntasks-per-node=2 --cpus-per-task=1)
jobs=()
names=()
cd "$src" || fail "cannot enter $src"
submit() {  # submit NAME SCRIPT ENV... [++ SCRIPT_ARGS...]; job_alloc overrides alloc
  local name=$1 script=$2 id vars=(); shift 2
  while [ $# -gt 0 ] && [ "$1" != ++ ]; do vars+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  local opts=("${alloc[@]}")
  [ -n "${job_alloc+x}" ] && opts=("${job_alloc[@]}")
  id=$(sl env "${common_env[@]}" "${vars[@]}" sbatch "${opts[@]}" --output="$dir/jobs/$name-%j.out" "$script" "$@") ||
    fail "sbatch $name"
  jobs+=("$id"); names+=("$name")
}
for launcher in srun mpirun; do
  submit "probe-$launcher" slurm/template.sbatch OVERLAP_PROGRAM="$build/tests/node_probe" OVERLAP_LAUNCHER=$launcher
  submit "mlp-$launcher" slurm/template.sbatch OVERLAP_PROGRAM="$build/tests/examples/tensor_parallel_mlp" \
    OVERLAP_LAUNCHER=$launcher
  submit "demo-$launcher" slurm/demo.sbatch OVERLAP_LAUNCHER=$launcher OVERLAP_DEMO_SIZE=64
  # The transformer layer on a dp x tp = 2 x 2 mesh, one tensor group per node.
  submit "layer-$launcher" slurm/layer.sbatch OVERLAP_LAUNCHER=$launcher \
    OVERLAP_LAYER_ARGS="--seq 64 --hidden 32 --heads 4 --steps 2"
done
# Every CPU of each node to one rank: 2 nodes x 1 task x $cpus CPUs, OpenMP
# threads bound to the cores, the product verified across the link.
job_alloc=(--parsable --nodes=2 --ntasks-per-node=1 --cpus-per-task="$cpus")
submit threads slurm/template.sbatch OVERLAP_PROGRAM="$src/tests/system/slurm/binding_probe.sh" \
  OVERLAP_PROBE_SETTING=given ++ "$build/tests/examples/tensor_parallel_mlp"
unset job_alloc

deadline=$((SECONDS + ${SLURM_TEST_TIMEOUT:-300}))
status=0
want_probe=""
for r in 0 1 2 3; do want_probe="${want_probe}rank $r node_ranks 2 one_node 0 nodes 2 ring 0,1,2,3;"; done
for i in "${!jobs[@]}"; do
  id=${jobs[$i]} name=${names[$i]}
  slurm_wait_job "$id" "$deadline" sl
  out="$dir/jobs/$name-$id.out"
  echo "job $id $name: $job_state exit $job_rc run time $job_runtime"
  if [ "$job_state" != COMPLETED ] || [ "$job_rc" != 0:0 ]; then status=1; cat "$out" 2>/dev/null; continue; fi
  case $name in
    probe-*)
      got=$(grep '^rank ' "$out" | sort -k2 -n | tr '\n' ';')
      [ "$got" = "$want_probe" ] || { echo "$name: '$got', want '$want_probe'"; status=1; } ;;
    threads)
      want=""
      for r in 0 1; do want="${want}probe rank $r cpus 0-$((cpus - 1)) threads $cpus bind close timeout 600 setting given;"; done
      [ "$cpus" -ge 2 ] || want=${want//cpus 0-0/cpus 0}
      got=$(grep '^probe ' "$out" | sort | tr '\n' ';')
      [ "$got" = "$want" ] || { echo "$name: '$got', want '$want'"; status=1; }
      [ "$(grep -c ' ok$' "$out")" -eq 2 ] || { echo "$name: did not verify on 2 ranks"; cat "$out"; status=1; } ;;
    mlp-*) [ "$(grep -c ' ok$' "$out")" -eq 4 ] || { echo "$name: did not verify on 4 ranks"; cat "$out"; status=1; } ;;
    demo-*) grep -q "^ring " "$out" && grep -q "^bulk " "$out" || { echo "$name: no bulk/ring lines"; cat "$out"; status=1; } ;;
    layer-*)
      { grep -q "on 4 ranks (dp 2 x cp 1 x tp 2)" "$out" && grep -q "^bulk " "$out" && grep -q "^ring " "$out" &&
        grep -q "^automatic " "$out"; } || { echo "$name: no 2 x 2 mesh or no bulk/ring/automatic rows"; cat "$out"; status=1; } ;;
  esac
  # The job ran on both nodes.
  grep -q "on node\[0-1\]" "$out" || { echo "$name: not on node[0-1]: $(head -n 1 "$out")"; status=1; }
done
[ $status -eq 0 ] || fail "some jobs failed"
echo "slurm multinode test: ok (${#jobs[@]} jobs on 2 emulated nodes x 2 ranks, srun and the MPI's launcher, ${OVERLAP_MPI_STACK:-openmpi})"
