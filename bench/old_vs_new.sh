#!/usr/bin/env bash
# Whether a refactoring kept the speed: overlap-bench built from OLD (a
# commit, in a temporary git worktree) against this tree's build, run side by
# side and interleaved (round r runs every case with OLD, then with the new
# build), on the emulated 2-node star (1 Gbit/s, TCP) when this machine
# allows it, else on shared memory. The companion of
# tools/identical/compare.sh, which checks the outputs.
#
#   bench/old_vs_new.sh OLD BUILD_DIR [ROUNDS]      (ROUNDS default: 3)
#
# Cases: all_gather_matmul lhs_rows, matmul_reduce_scatter rows and
# matmul_all_reduce rows, f32, 2048^3, bulk and ring, 5 measured iterations each (overlap-bench reports
# the median of the slowest rank). Prints, per case, the median over rounds
# of each build and new / old. Nothing else should load the machine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
old=${1:?usage: old_vs_new.sh OLD BUILD_DIR [ROUNDS]}
build=$(cd "${2:?usage: old_vs_new.sh OLD BUILD_DIR [ROUNDS]}" && pwd)
rounds=${3:-3}
new_bin="$build/apps/overlap-bench"
[ -x "$new_bin" ] || { echo "old_vs_new: $new_bin is missing (build the tree first)" >&2; exit 1; }
work=$(mktemp -d /tmp/overlap-old-vs-new.XXXXXX)
vc="$root/tools/vcluster/vcluster"
export VCLUSTER_PREFIX=ovlspeed VCLUSTER_STATE="$work/vcluster"
cleanup() {
  [ -n "${cluster_up:-}" ] && "$vc" down >/dev/null 2>&1
  git -C "$root" worktree remove --force "$work/old" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "old_vs_new: building overlap-bench at $old"
git -C "$root" worktree add --detach "$work/old" "$old" >/dev/null
cmake -S "$work/old" -B "$work/old/build" -DCMAKE_BUILD_TYPE=Release -DOVERLAP_BUILD_TESTS=OFF \
  -DOVERLAP_BUILD_BENCH=OFF >/dev/null
cmake --build "$work/old/build" -j "$(nproc)" --target overlap-bench >/dev/null
old_bin="$work/old/build/apps/overlap-bench"

export OMP_NUM_THREADS=1
# shellcheck source=tools/mpi/stack
source "$root/tools/mpi/stack"
mpi_stack_setup "" "$build" || exit 1
if reason=$("$vc" check 2>&1); then
  "$vc" up --nodes 2 --rate 1gbit --topology star >/dev/null
  cluster_up=1
  export OVERLAP_TRANSPORT="tcp, emulated 2-node star at 1 Gbit/s"
  launch=("$vc" run -np 2)
else
  echo "old_vs_new: no emulated cluster here (${reason#vcluster: }); shared memory" >&2
  export OVERLAP_TRANSPORT="shared memory"
  launch=(mpi_run 2)
fi

cases=("--op ag --variant lhs_rows" "--op rs --variant rows" "--op ar --variant rows")
for ((r = 1; r <= rounds; ++r)); do
  for which in old new; do
    bin=$old_bin
    [ "$which" = new ] && bin=$new_bin
    for c in "${cases[@]}"; do
      # shellcheck disable=SC2086
      "${launch[@]}" "$bin" $c -m 2048 -n 2048 -k 2048 --dtype f32 --strategies ring --no-peers \
        --iters 5 --warmup 1 --json "$work/$which.json" >/dev/null 2> >(grep -v setpgid >&2)
    done
  done
  echo "old_vs_new: round $r of $rounds done"
done

python3 - "$work/old.json" "$work/new.json" "$OVERLAP_TRANSPORT" "$old" <<'EOF'
import json, statistics, sys
def load(path):
    rows = {}
    for line in open(path):
        j = json.loads(line)
        rows.setdefault((j["op"], j["strategy"]), []).append(j["time_ms"])
    return rows
old, new = load(sys.argv[1]), load(sys.argv[2])
print(f"overlap-bench, 2 ranks, {sys.argv[3]}, f32 2048^3, median of 5 iterations (slowest rank),")
print(f"then the median over {len(next(iter(old.values())))} interleaved rounds; old = {sys.argv[4]}")
print(f"{'op':<24}{'strategy':<10}{'old ms':>10}{'new ms':>10}{'new/old':>9}   rounds (old | new)")
for key in sorted(old):
    o, n = statistics.median(old[key]), statistics.median(new[key])
    print(f"{key[0]:<24}{key[1]:<10}{o:>10.1f}{n:>10.1f}{n / o:>9.3f}   "
          f"{' '.join(f'{v:.0f}' for v in old[key])} | {' '.join(f'{v:.0f}' for v in new[key])}")
EOF
