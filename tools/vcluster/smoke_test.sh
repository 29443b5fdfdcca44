#!/usr/bin/env bash
# CI smoke test of the emulated cluster: 2 nodes up (star, 1 Gbit/s), both ops
# checked across the namespaces over TCP (the tensor-parallel MLP example
# verifies itself), down, and nothing of ours left behind. No timing asserted.
# Exit 77 (skipped) with a reason where the machine forbids namespaces or tbf.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prog=${1:?usage: smoke_test.sh PROGRAM}
vc="$here/vcluster"
# A prefix of its own, so a vcluster someone has up is left alone.
export VCLUSTER_PREFIX=ovlsmoke VCLUSTER_STATE=/tmp/overlap-vcluster-smoke.$$

reason=$("$vc" check 2>&1) || { echo "SKIPPED: ${reason#vcluster: }"; exit 77; }

trap '"$vc" down >/dev/null 2>&1' EXIT
"$vc" up --nodes 2 --rate 1gbit --topology star || exit 1
OMP_NUM_THREADS=1 timeout 120 "$vc" run -np 2 "$prog"
rc=$?
"$vc" down
left=$(ip netns list | awk '{print $1}' | grep "^$VCLUSTER_PREFIX-" || true)
[ -z "$left" ] || { echo "left behind: $left"; exit 1; }
[ "$rc" -eq 0 ] || { echo "the run across the namespaces failed (rc=$rc)"; exit 1; }
echo "vcluster smoke test: ok (2 nodes, star, tcp)"
