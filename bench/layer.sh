#!/usr/bin/env bash
# P8 (issue 14): training steps (forward + backward) of the realistic
# transformer block (overlap-layer's defaults: seq 2048, hidden 1024, 16
# heads, ffn 4096), every op bulk against every op decomposed (ring, and the
# library's automatic choice), side by side in one run, f32 and bf16, on the
# emulated 2-node star and 4-node ring at 1 Gbit/s. JSON lines to
# OUT/layer.jsonl; the timeline of one bulk and one ring step per topology
# to OUT/layer-<topology>.svg (tools/trace/render.py), and what those steps
# spent where to OUT/layer-traces.jsonl (tools/trace/summary.py).
#
#   bench/layer.sh BUILD_DIR VCLUSTER OUT [STEPS]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: layer.sh BUILD_DIR VCLUSTER OUT [STEPS]}
vc=${2:?usage: layer.sh BUILD_DIR VCLUSTER OUT [STEPS]}
out=${3:?usage: layer.sh BUILD_DIR VCLUSTER OUT [STEPS]}
steps=${4:-5}
layer="$(cd "$build" && pwd)/apps/overlap-layer"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per rank, as users run a full node
# The build's MPI stack (tools/mpi/stack): its launcher, flags and
# environment, and VCLUSTER_MPI for the emulated cluster.
# shellcheck source=tools/mpi/stack
source "$(dirname "$0")/../tools/mpi/stack"
mpi_stack_setup "" "$(cd "$build" && pwd)" || exit 1
traces=$(mktemp -d /tmp/overlap-layer-traces.XXXXXX)
trap 'rm -rf "$traces"; "$vc" down >/dev/null 2>&1' EXIT  # also the cluster this script brings up
rm -f "$out/layer.jsonl" "$out/layer-traces.jsonl"
for topo in star:2 ring:4; do
  kind=${topo%%:*} nodes=${topo#*:}
  name="$kind$nodes"
  "$vc" up --nodes "$nodes" --rate 1gbit --topology "$kind" >&2 || exit 1
  export OVERLAP_TRANSPORT="tcp, emulated $nodes-node $kind, 1 Gbit/s per link"
  for dtype in f32 bf16; do
    echo "[$name] overlap-layer $dtype: bulk, ring, automatic; $steps steps" >&2
    "$vc" run -np "$nodes" "$layer" --dtype "$dtype" --modes ring,automatic --steps "$steps" \
      --json "$out/layer.jsonl" >&2 || exit 1
  done
  for mode in bulk ring; do
    echo "[$name] timeline of one $mode step (f32)" >&2
    OVERLAP_TRACE="$traces/$name/$mode" "$vc" run -np "$nodes" "$layer" --only --modes "$mode" --steps 1 \
      --warmup 1 --no-check > /dev/null || exit 1
  done
  for mode in bulk ring; do  # what the traced step spent where (the bound of any overlap: bulk's collectives)
    python3 "$here/../tools/trace/summary.py" "$traces/$name/$mode" "$name $mode" >> "$out/layer-traces.jsonl" || exit 1
  done
  python3 "$here/../tools/trace/render.py" "$out/layer-$name.svg" "$traces/$name/bulk:every op bulk ($name, f32)" \
    "$traces/$name/ring:every op ring ($name, f32)" >&2 || exit 1
done
