#!/usr/bin/env bash
# OVERLAP_TRACE=DIR: every rank writes DIR/rank<R>.json, a Chrome trace
# object with a traceEvents list: a process track named after the rank, the
# op spans (ring and bulk collective), one GEMM span per ring step and
# transfers as matched begin/end pairs naming peer and bytes; the render
# script turns two traces into one SVG. Without the variable nothing is
# written. Ranks 3, uneven shards (M not a multiple of 3); the ring and the
# other-operands algorithm (its output blocks go point to point).
set -euo pipefail
# The MPI stack of the tests (tools/mpi/stack: its launcher and flags).
source "$(dirname "$0")/../../tools/mpi/stack"
mpi_stack_setup
bench=${1:?usage: trace_test.sh OVERLAP_BENCH RENDER_PY}
render=${2:?usage: trace_test.sh OVERLAP_BENCH RENDER_PY}
dir=$(mktemp -d /tmp/overlap-trace-test.XXXXXX)
trap 'rm -rf "$dir"' EXIT
run() { mpi_run 3 "$bench" -m 100 -n 64 -k 48 --iters 2 --warmup 0 \
          --no-peers --strategies ring,others > /dev/null; }
# Off: nothing written, neither in the working directory nor next to it.
mkdir "$dir/cwd"
(cd "$dir/cwd" && unset OVERLAP_TRACE && run)
[ -z "$(ls -A "$dir/cwd")" ] && [ "$(ls -A "$dir")" = cwd ] || { echo "files written with OVERLAP_TRACE unset"; exit 1; }
OVERLAP_TRACE="$dir/on" run
python3 - "$dir/on" <<'PY'
import json, sys, os
d = sys.argv[1]
files = sorted(os.listdir(d))
assert files == ["rank0.json", "rank1.json", "rank2.json"], files
for r in range(3):
    doc = json.load(open(os.path.join(d, f"rank{r}.json")))
    ev = doc["traceEvents"]
    assert isinstance(ev, list) and ev, r
    names = [e for e in ev if e["ph"] == "M" and e["name"] == "process_name"]
    assert names and names[0]["args"]["name"] == f"rank {r}" and all(e["pid"] == r for e in ev), r
    ops = [e for e in ev if e.get("cat") == "op"]
    assert any("ring" in e["name"] for e in ops), "no ring op span"
    assert any(e.get("cat") == "collective" for e in ev), "no bulk collective span"
    gemm = [e for e in ev if e.get("cat") == "gemm" and e["name"].startswith("gemm, step")]
    # every ring call: 3 ranks x chunks steps; at least one step span per step of a call
    steps = {e["name"] for e in gemm}
    assert len(steps) >= 3, steps
    assert all(e["dur"] >= 0 for e in ev if e["ph"] == "X")
    begins = {e["id"]: e for e in ev if e["ph"] == "b"}
    ends = {e["id"]: e for e in ev if e["ph"] == "e"}
    assert begins and begins.keys() == ends.keys(), "unmatched transfer events"
    for i, b in begins.items():
        assert ends[i]["ts"] >= b["ts"] and b["args"]["peer"] in (0, 1, 2), b
        # what the message holds, not one element: a ring piece has rows of
        # K = 48 floats, an output block 33 x 21 or more
        assert b["args"]["bytes"] % 4 == 0 and b["args"]["bytes"] >= 4 * 48, b
        assert b["args"]["peer"] != r, b
print("trace files ok")
PY
python3 "$render" "$dir/picture.svg" "$dir/on:first" "$dir/on:again" > /dev/null
grep -q "<rect" "$dir/picture.svg" && grep -q "rank 2 steps" "$dir/picture.svg"
echo "trace test: ok"
