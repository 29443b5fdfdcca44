#!/usr/bin/env bash
# The demo behind `make demo`: training steps (forward + backward) of a
# tensor-parallel transformer block at 2 ranks (overlap-layer: seq 1024,
# hidden 1024, 16 heads, ffn 4096, f32), every op bulk against every op
# decomposed, side by side, checked against the same block in double
# precision; then the timeline of one bulk and one ring step as one picture.
# On an emulated 2-node cluster (network namespaces, 1 Gbit/s links) when
# this machine allows it (root, the tbf qdisc); otherwise on shared memory,
# where there is nothing to hide.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: demo.sh BUILD_DIR}
layer="$(cd "$build" && pwd)/apps/overlap-layer"
pictures="$(cd "$build" && pwd)/demo"
args=(--seq 1024 --hidden 1024 --heads 16)
export OMP_NUM_THREADS=1
# The build's MPI stack (tools/mpi/stack): its launcher, flags and
# environment, and VCLUSTER_MPI for the emulated cluster.
# shellcheck source=tools/mpi/stack
source "$(dirname "$0")/../tools/mpi/stack"
mpi_stack_setup "" "$(cd "$build" && pwd)" || exit 1
traces=$(mktemp -d /tmp/overlap-demo-traces.XXXXXX)
vc="$here/../tools/vcluster/vcluster"

if reason=$("$vc" check 2>&1); then
  export VCLUSTER_PREFIX=ovldemo VCLUSTER_STATE=/tmp/overlap-vcluster-demo.$$
  trap '"$vc" down >/dev/null 2>&1; rm -rf "$traces"' EXIT
  "$vc" up --nodes 2 --rate 1gbit --topology star || exit 1
  echo "Two emulated nodes joined by a 1 Gbit/s link (TCP); one core each for compute."
  export OVERLAP_TRANSPORT="tcp, emulated 2-node star at 1 Gbit/s"
  launch=("$vc" run -np 2)
else
  trap 'rm -rf "$traces"' EXIT
  echo "Cannot emulate a cluster here (${reason#vcluster: }): running on shared memory."
  echo "There the MPI copy uses the same cores as the GEMMs, so expect ring ~ bulk, not a gain."
  export OVERLAP_TRANSPORT="shared memory"
  launch=(mpi_run 2)
fi
"${launch[@]}" "$layer" "${args[@]}" --steps 5 --modes ring,automatic 2> >(grep -v setpgid >&2) || exit 1
for mode in bulk ring; do
  OVERLAP_TRACE="$traces/$mode" "${launch[@]}" "$layer" "${args[@]}" --only --modes "$mode" --steps 1 --no-check \
    > /dev/null 2> >(grep -v setpgid >&2) || exit 1
done
mkdir -p "$pictures"
python3 "$here/../tools/trace/render.py" "$pictures/layer-timeline.svg" "$traces/bulk:every op bulk" \
  "$traces/ring:every op ring" > /dev/null || exit 1
echo "Timeline of one bulk and one ring step (every rank's layer phases, ops, ring steps, transfers):"
echo "  $pictures/layer-timeline.svg (docs/layer.md explains it)"
