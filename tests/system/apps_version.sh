#!/usr/bin/env bash
# Every app's --version prints the package's version (CMake's, read from
# include/overlap/core/version.hpp) and exits 0; --help shows defaults and, for
# overlap-bench, what -m/-n/-k mean for each variant. One process each, no
# launcher: MPI starts as a singleton.
set -euo pipefail
want=${1:?usage: apps_version.sh VERSION APP...}
shift
fail=0
for app in "$@"; do
  got=$(timeout 60 "$app" --version) || { echo "FAIL: $app --version exited $?"; fail=1; continue; }
  if [ "$got" != "$want" ]; then
    echo "FAIL: $app --version printed '$got', want '$want'"; fail=1
  else
    echo "ok: $(basename "$app") --version = $got"
  fi
  help=$(timeout 60 "$app" --help)
  # CLI11 shows a captured default after the type, as TYPE=value: every app
  # has options with defaults.
  if ! grep -q -- '--version' <<< "$help" || ! grep -qE '^ +-[-a-z,]+ [A-Z:]+=[^ ]' <<< "$help"; then
    echo "FAIL: $app --help lists no --version or no defaults"; fail=1
  fi
  if [[ $(basename "$app") == overlap-bench ]]; then
    for v in lhs_rows lhs_cols rhs_rows rhs_cols 'variant rows' 'variant cols'; do
      grep -q -- "$v" <<< "$help" || { echo "FAIL: overlap-bench --help does not explain $v"; fail=1; }
    done
    grep -qE -- '--iters [A-Z:]+=[0-9]' <<< "$help" || { echo "FAIL: overlap-bench --help shows no default of --iters"; fail=1; }
  fi
done
exit $fail
