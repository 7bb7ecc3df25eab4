#!/usr/bin/env bash
# The calibration's measurements on one GPU (results/calibration/), by part:
#   OUT=/tmp/o bash benchmarks/gpu_calibration.sh sweep heat
# then, on any machine, with the runs copied under results/calibration/:
#   python -m calibrate fit
# Parts:
#   sweep   `python -m calibrate sweep`: the pass-shape grid the cost model is fitted on (SWEEP_ARGS: more options)
#   heat    `python -m calibrate heat`: designed sequences of passes after rests, for the heat's slow-downs
#           (HEAT_REPEATS rounds, default 3)
#   profile benchmarks/profile_paged_decode.py: where the continuous engine's decode pass spends its time
. "$(dirname "$0")/gpu_prelude.sh"
for part in "$@"; do
  case $part in
    sweep) run 300 python3 -m calibrate sweep --out "$R" ${SWEEP_ARGS:-} ;;
    heat) run 400 python3 -m calibrate heat --out "$R" --repeats "${HEAT_REPEATS:-3}" ;;
    profile) run 300 python3 benchmarks/profile_paged_decode.py --json "$R/profile_paged_decode.json" ;;
    *) echo "unknown part $part (sweep heat profile)"; exit 2 ;;
  esac
done
echo "elapsed ${SECONDS}s"
tar czf "$OUT/results.tgz" -C "$(dirname "$R")" "$(basename "$R")"
