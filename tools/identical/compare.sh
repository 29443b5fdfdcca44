#!/usr/bin/env bash
# Whether two versions of the library compute bit-identical outputs: builds
# tools/identical/outputs.cpp (a fixed sweep of calls of both ops, hashing
# every rank's outputs) against the headers of OLD (a commit) and of this
# working tree, in the header-only flavour, runs both at each rank count,
# and diffs their lines. For refactorings that must not change results.
#
#   tools/identical/compare.sh OLD [RANKS...]     (RANKS default: 1 2 3 4 5)
#
# MPICXX (default mpicxx) compiles; the launcher and its flags come from
# tools/mpi/stack (the stack of the first mpiexec on PATH, or
# OVERLAP_MPI_STACK). Both builds run with the same environment, so the same
# progress policy (OVERLAP_PROGRESS) and ISA (ONEDNN_MAX_CPU_ISA) apply to
# both. Exit status 0 when every line matches.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
old=${1:?usage: compare.sh OLD [RANKS...]}
shift
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(1 2 3 4 5)
work=$(mktemp -d /tmp/overlap-identical.XXXXXX)
trap 'git -C "$root" worktree remove --force "$work/old" >/dev/null 2>&1; rm -rf "$work"' EXIT
git -C "$root" worktree add --detach "$work/old" "$old" >/dev/null 2>&1 ||
  { echo "compare.sh: no commit $old in $root" >&2; exit 2; }
cxx=${MPICXX:-mpicxx}
# shellcheck source=../mpi/stack
source "$root/tools/mpi/stack"
mpi_stack_setup
build() {  # TREE OUT: the sweep against TREE's headers (the program is this tree's)
  "$cxx" -std=c++17 -O2 -fopenmp -I "$1/include" -I /usr/include/eigen3 "$here/outputs.cpp" -o "$2" -ldnnl
}
echo "compare.sh: building the sweep against $old and against this tree" >&2
build "$work/old" "$work/outputs-old" &
build "$root" "$work/outputs-new"
wait $! || { echo "compare.sh: the sweep does not build against $old" >&2; exit 2; }
status=0
for n in "${ranks[@]}"; do
  for v in old new; do  # bounded: a hang in either build ends the comparison
    timeout 600 "$MPIEXEC" "${MPI_FLAGS[@]}" -n "$n" "$work/outputs-$v" > "$work/$v-$n.txt" ||
      { echo "compare.sh: the $v build failed or hung at $n ranks" >&2; exit 2; }
  done
  cases=$(wc -l < "$work/new-$n.txt")
  refused=$(grep -c ' error: ' "$work/new-$n.txt" || true)
  if diff "$work/old-$n.txt" "$work/new-$n.txt" > "$work/diff-$n.txt"; then
    echo "$n ranks: $cases cases identical ($refused of them refused by both)"
  else
    echo "$n ranks: $(grep -c '^>' "$work/diff-$n.txt") of $cases cases differ:"
    sed -n 's/^> /  new: /p; s/^< /  old: /p' "$work/diff-$n.txt" | head -20
    status=1
  fi
done
exit $status
