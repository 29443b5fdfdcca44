#!/usr/bin/env bash
# Issue 28's runs (the SMPI part of `make bench`): the real programs, built
# with smpicxx (make smpi), under smpirun on the platforms of tools/smpi/.
#   validation  bench/model_sweep.sh's 8 shapes on the SMPI mirrors of the
#               emulated 2-node star and 4-node ring (1 and 10 Gbit/s), GEMMs
#               computed and every result checked; the emulated side is
#               docs/results/model-*.jsonl.
#   layer       overlap-layer's training steps on the 1 Gbit/s mirrors, bulk
#               against decomposed: the share of the block's communication
#               hidden when the cores compute alone.
#   model       the cost model where noise no longer hides it: both ops,
#               2-64 ranks of the fat trees at 25, 100 and 200 Gbit/s, 4
#               shapes each (2 at 64 ranks; 78 cases); timing only, every
#               GEMM charged the calibration's figure for its shape
#               (OVERLAP_SIM_COMPUTE=calibrated): the model's schedules and
#               network, checked apart from its GEMM rate grid.
#   model-measured  (not run by default: 35 minutes on 2 cores) the same
#               cases with GEMMs charged the median of real runs of their
#               shapes (OVERLAP_SIM_COMPUTE=skipped): the model end to end,
#               the grid's interpolation and this machine's noise included.
# Each platform and rank count gets its calibration from overlap-calibrate
# run there (GEMM rates measured once per node speed, the links per run).
# JSON lines and calibrations go to docs/results/smpi/; bench/smpi_report.py
# turns them into docs/results.md's and docs/scaling.md's SMPI sections.
#
#   scale       the MLP block's two products (tokens 4096, hidden 4096, ffn
#               16384) on one tensor group of 8-128 ranks at 25 and 100
#               Gbit/s, and on dp x tp meshes of 8-rank groups (32-256 ranks,
#               the groups at once on one fat tree), timing only, beside the
#               cost model's projection of the same platform
#               (bench/projection.cpp, $PROJECTION) in docs/scaling.md.
#   block       overlap-layer's whole block (forward and backward) on one
#               tensor group of 8 and 16 ranks and a 4 x 8 mesh of the
#               100 Gbit/s fat tree, timing only, in docs/scaling.md.
# SMPI_SWEEP_PARTS (default "validation layer model scale block"; add model-measured) runs some parts; the
# report is written from whatever JSON lines are there. The simulations are
# single-threaded; at 64 ranks the collectives' calibration holds about
# 20 GiB: run nothing else big beside it on a 24 GiB machine.
#
#   bench/smpi_sweep.sh BUILD_SMPI_DIR [--quick]
set -euo pipefail
build=$(cd "${1:?usage: smpi_sweep.sh BUILD_SMPI_DIR [--quick]}" && pwd)
quick=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/docs/results/smpi"
plat="$root/tools/smpi"
bench="$build/apps/overlap-bench"
calibrate="$build/apps/overlap-calibrate"
mkdir -p "$out"
export OMP_NUM_THREADS=1
t_start=$SECONDS

# smpi PLATFORM NP PROGRAM ARGS...: PROGRAM on tools/smpi/PLATFORM.xml.
smpi() { "$plat/run" "$@"; }
# gemm_rates PLATFORM FILE: the node's GEMM rates (f32), measured at 2 ranks,
# once per run of this script (5 s). The simulation charges GEMMs as timed
# on the machine that runs it, so rates from an earlier run, maybe on
# another CPU, would not be the rates the simulated GEMMs run at (the
# files of an AMD EPYC were once about to be reused on an Intel Xeon).
measured_gemm=" "
gemm_rates() {
  [[ $measured_gemm == *" $2 "* ]] && return 0
  echo "[smpi] GEMM rates of $1's nodes" >&2
  smpi "$1" 2 "$calibrate" --dtypes f32 -o "$2" > /dev/null
  measured_gemm+="$2 "
}
# calibration PLATFORM NP GEMM_FILE OUT: GEMM_FILE's rates plus the links of NP ranks there.
calibration() {
  cp "$3" "$4"
  smpi "$1" "$2" "$calibrate" --links-only --update -o "$4" > /dev/null
}
# case PLATFORM NP CALIBRATION JSON LABEL BENCH_ARGS...
case_run() {
  OVERLAP_CALIBRATION="$3" OVERLAP_TRANSPORT="smpi, $5" smpi "$1" "$2" "$bench" "${@:6}" --json "$4" > /dev/null
}

parts=${SMPI_SWEEP_PARTS:-validation layer model scale block}
mirror_gemm="$out/gemm-1core.json" fat_gemm="$out/gemm-32core.json"  # GEMM rates of the two node speeds
# --- validation: the emulated clusters' mirrors, model_sweep.sh's shapes ---
if [[ " $parts " == *" validation "* ]]; then
gemm_rates star2-10gbit "$mirror_gemm"
shapes=(
  "ag lhs_rows 2048 128 2048" "ag lhs_rows 2048 512 2048" "ag lhs_rows 2048 2048 2048"
  "ag rhs_cols 256 2048 2048" "ag rhs_cols 2048 2048 2048"
  "rs rows 2048 2048 128" "rs rows 2048 2048 512" "rs rows 2048 2048 2048"
)
[ "$quick" = --quick ] && shapes=("ag lhs_rows 2048 128 2048" "rs rows 2048 2048 2048")
for mirror in star2-1gbit star2-10gbit ring4-1gbit ring4-10gbit; do
  np=${mirror:4:1}
  cal="$out/mirror-$mirror-calibration.json"
  calibration "$mirror" "$np" "$mirror_gemm" "$cal"
  strategies=ring,others,automatic
  [ "$np" -ge 3 ] && strategies=ring,bidirectional,others,automatic
  rm -f "$out/mirror-$mirror.jsonl"
  for s in "${shapes[@]}"; do
    read -r op variant m n k <<< "$s"
    echo "[smpi mirror $mirror] $op $variant M=$m N=$n K=$k" >&2
    case_run "$mirror" "$np" "$cal" "$out/mirror-$mirror.jsonl" "$mirror mirror" --op "$op" --variant "$variant" \
      -m "$m" -n "$n" -k "$k" --strategies "$strategies" --iters 5
  done
done
echo "[smpi] validation done at $((SECONDS - t_start)) s" >&2
fi

# --- model: 2-64 ranks, three link rates, timing only ---
# Shapes scale with the ranks so that every rank holds the same shard: per
# rank a 4096 x 2048 (ag) or 4096 x 2048 output (rs) product over N or K =
# 512 (square-ish) or 128 (thin) per rank. At 3.2 Tf a rank's GEMM takes
# about 2.7 or 0.7 ms; the 32 MiB its collective moves take 10.7 ms at
# 25 Gbit/s and 1.3 ms at 200: comm-bound to compute-bound across the rates.
# At 64 ranks only the square-ish shapes, and no forced `others` row: SMPI
# solves an all-to-all's 4032 flows at once, minutes per call (automatic
# still weighs others, and would run it if it chose it).
# model_cases MODE PREFIX: the sweep with GEMMs charged by OVERLAP_SIM_COMPUTE=MODE,
# into $out/PREFIX-PLATFORM.jsonl.
calibrated_ranks=" "  # "PLATFORM:NP " whose calibration this run measured
model_cases() {
gemm_rates fattree1024-100gbit "$fat_gemm"
ranks=(2 3 4 8 16 32 64)
[ "$quick" = --quick ] && ranks=(2 3)
for rate in 25 100 200; do
  p="fattree1024-${rate}gbit"
  rm -f "$out/$2-$p.jsonl"
  for np in "${ranks[@]}"; do
    cal="$out/model-$p-${np}ranks-calibration.json"
    if [[ $calibrated_ranks != *" $p:$np "* ]]; then
      calibration "$p" "$np" "$fat_gemm" "$cal"
      calibrated_ranks+="$p:$np "
    fi
    strategies=ring,others,automatic pers="512 128"
    [ "$np" -ge 3 ] && strategies=ring,bidirectional,others,automatic
    [ "$np" -ge 64 ] && strategies=ring,bidirectional,automatic pers=512
    for per in $pers; do
      echo "[smpi $2 $p] $np ranks, $per per rank ($((SECONDS - t_start)) s)" >&2
      for op in ag rs; do
        dims=(-m 4096 -k 2048 -n $((per * np)))
        [ $op = rs ] && dims=(-m 4096 -n 2048 -k $((per * np)))
        OVERLAP_SIM_COMPUTE=$1 case_run "$p" "$np" "$cal" "$out/$2-$p.jsonl" "$p, $np ranks" --op $op \
          "${dims[@]}" --strategies "$strategies" --iters 2 --warmup 1 --no-peers --no-check
      done
    done
  done
done
echo "[smpi] $2 sweep done at $((SECONDS - t_start)) s" >&2
}
if [[ " $parts " == *" model "* ]]; then model_cases calibrated model; fi
if [[ " $parts " == *" model-measured "* ]]; then model_cases skipped model-measured; fi

# --- layer: the transformer block's training steps on the 1 Gbit/s mirrors ---
# overlap-layer's defaults (seq 2048, hidden 1024, 16 heads, ffn 4096), f32,
# bulk against ring and automatic, GEMMs computed and the block checked in
# double precision; automatic reads the mirror's calibration (validation).
if [[ " $parts " == *" layer "* ]]; then
layer="$build/apps/overlap-layer"
for mirror in star2-1gbit ring4-1gbit; do
  np=${mirror:4:1}
  cal="$out/mirror-$mirror-calibration.json"
  # The validation part of this run measured it; else it may hold another machine's GEMM rates.
  if [[ " $parts " != *" validation "* ]]; then
    gemm_rates star2-10gbit "$mirror_gemm"
    calibration "$mirror" "$np" "$mirror_gemm" "$cal"
  fi
  rm -f "$out/layer-$mirror.jsonl"
  echo "[smpi layer $mirror] overlap-layer f32: bulk, ring, automatic ($((SECONDS - t_start)) s)" >&2
  OVERLAP_CALIBRATION="$cal" OVERLAP_TRANSPORT="smpi, $mirror mirror" smpi "$mirror" "$np" "$layer" \
    --modes ring,automatic --steps 3 --json "$out/layer-$mirror.jsonl" > /dev/null
done
echo "[smpi] layer done at $((SECONDS - t_start)) s" >&2
fi

# --- scale: the MLP block's products, one tensor group and dp x tp meshes ---
if [[ " $parts " == *" scale "* ]]; then
mlp() {  # mlp PLATFORM NP CALIBRATION TP [STRATEGIES]: both products of the block, timing only
  local common=(--strategies "${5:-ring,bidirectional,automatic}" --iters 1 --warmup 1 --no-peers --no-check --tp "$4")
  for op in "ag -m 4096 -k 4096 -n 16384" "rs -m 4096 -n 4096 -k 16384"; do
    # shellcheck disable=SC2086
    OVERLAP_SIM_COMPUTE=skipped OVERLAP_SIM_SAMPLES=2 case_run "$1" "$2" "$3" "$out/scale-$1.jsonl" \
      "$1, $2 ranks" --op $op "${common[@]}"
  done
}
# SMPI_SCALE_RATES, SMPI_SCALE_RANKS and SMPI_SCALE_DP narrow the scale runs.
for rate in ${SMPI_SCALE_RATES:-25 100}; do
  p="fattree1024-${rate}gbit"
  gemm_rates fattree1024-100gbit "$fat_gemm"
  rm -f "$out/scale-$p.jsonl"
  for np in ${SMPI_SCALE_RANKS:-8 16 32 64 128}; do
    echo "[smpi scale $p] one group of $np ranks ($((SECONDS - t_start)) s)" >&2
    # Beyond 64 ranks no calibration (the links' took over 10 minutes at 128
    # ranks), so no automatic: bulk against the ring schedules.
    if [ "$np" -gt 64 ]; then
      mlp "$p" "$np" "" 0 ring,bidirectional
      continue
    fi
    cal="$out/model-$p-${np}ranks-calibration.json"
    # The model parts of this run measured it; else it may hold another machine's GEMM rates.
    [[ $calibrated_ranks == *" $p:$np "* ]] || calibration "$p" "$np" "$fat_gemm" "$cal"
    mlp "$p" "$np" "$cal" 0
  done
  [ "$rate" = 100 ] || continue
  for dp in ${SMPI_SCALE_DP:-4 32}; do  # 8-rank groups, the 8-rank calibration (a group's own links)
    echo "[smpi scale $p] $dp groups of 8 ($((SECONDS - t_start)) s)" >&2
    mlp "$p" $((8 * dp)) "$out/model-$p-8ranks-calibration.json" 8
  done
done
echo "[smpi] scale done at $((SECONDS - t_start)) s" >&2
fi

# --- block: overlap-layer's whole block (forward and backward) on the fat tree ---
# Its default block (seq 2048, hidden 1024, 16 heads, ffn 4096, f32) on one
# tensor group of 8 and of 16 ranks and on a 4 x 8 mesh of the 100 Gbit/s fat
# tree, bulk against ring and automatic, timing only (GEMMs charged from 3
# real runs per shape, then skipped; the block's local work, attention
# included, is timed by SMPI as it runs). 16 heads allow tensor groups of
# up to 16; each rank holds its group's activations (about 120 MiB).
if [[ " $parts " == *" block "* ]]; then
p=fattree1024-100gbit
gemm_rates "$p" "$fat_gemm"
rm -f "$out/block-$p.jsonl"
for spec in "8 0" "16 0" "32 8"; do
  read -r np tp <<< "$spec"
  group=$np
  [ "$tp" -gt 0 ] && group=$tp
  # The model or scale part of this run measured the group's calibration;
  # else the block measures its own (the model part's files stay as it ran).
  cal="$out/model-$p-${group}ranks-calibration.json"
  if [[ $calibrated_ranks != *" $p:$group "* ]]; then
    cal="$out/block-$p-${group}ranks-calibration.json"
    calibration "$p" "$group" "$fat_gemm" "$cal"
  fi
  echo "[smpi block $p] $np ranks in groups of $group ($((SECONDS - t_start)) s)" >&2
  OVERLAP_SIM_COMPUTE=skipped OVERLAP_SIM_SAMPLES=3 OVERLAP_CALIBRATION="$cal" OVERLAP_TRANSPORT="smpi, $p, $np ranks" \
    smpi "$p" "$np" "$build/apps/overlap-layer" --modes ring,automatic --steps 2 --warmup 1 --no-check --tp "$tp" \
    --json "$out/block-$p.jsonl" > /dev/null
done
echo "[smpi] block done at $((SECONDS - t_start)) s" >&2
fi

if [[ " $parts " == *" scale "* ]] && [ -n "${PROJECTION:-}" ] && [ -x "$PROJECTION" ]; then
  gemm_rates star2-10gbit "$mirror_gemm"
  "$PROJECTION" "$out/gemm-1core.json" --cores 32 --efficiency 1 --gbit 25,100 --latency-us 4 --slowdown 1 \
    --tokens 4096 --hidden 4096 > "$out/scale-projection.jsonl"
fi
python3 "$root/bench/smpi_report.py" "$out" "$root/docs/results.md" "$root/docs/scaling.md"
