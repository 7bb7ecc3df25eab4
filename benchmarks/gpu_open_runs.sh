#!/usr/bin/env bash
# Open runs of the continuous engine on one GPU (results/continuous/, and the same setups measured
# again, results/continuous-repeats/, with RESULTS=$OUT/repeats), by part; what `python -m sim compare`
# and benchmarks/capacity_check.py replay:
#   OUT=/tmp/o bash benchmarks/gpu_open_runs.sh seed azure
#   OUT=/tmp/o RATES=30,60 DURATION=40 bash benchmarks/gpu_open_runs.sh seed
#   OUT=/tmp/o SCALES=7,8,9.375,10 POLICIES=continuous bash benchmarks/gpu_open_runs.sh capacity
#   OUT=/tmp/o REPLICAS=2 RATES=150 REQUESTS=600 bash benchmarks/gpu_open_runs.sh seed
# Parts (a part suffixed @N runs on GPU N of the machine):
#   seed      the part0 workload's Poisson arrivals at RATES req/s (default 1,3,5,7,15,30,60), REQUESTS a
#             rate (default 50) or DURATION seconds of arrivals
#   azure     the Azure conversation trace's WINDOW (default 1200:1520) at SCALES times its rate (default 16,32)
#   azure1x   the trace's window AZURE_1X (default 1200:1380) at its own rate
#   capacity  the window at the scales around the simulator's capacity answer (SCALES, default
#             7,8,9,9.375,10,10.375,11), named azure-cap
# Every part takes MODEL (default qwen2.5-1.5b), POLICIES (default continuous,chunked), REPLICAS (default 1) and, with 2 or more,
# ROUTERS (default round-robin,least-outstanding); CAP is each part's time cap in seconds (default 300).
. "$(dirname "$0")/gpu_prelude.sh"
POLICIES=${POLICIES:-continuous,chunked} REPLICAS=${REPLICAS:-1} CAP=${CAP:-300}
WINDOW=${WINDOW:-1200:1520}
served() {
  local extra=(--policy "$POLICIES" --model "${MODEL:-qwen2.5-1.5b}")
  [ "$REPLICAS" -gt 1 ] && extra+=(--replicas "$REPLICAS" --router "${ROUTERS:-round-robin,least-outstanding}")
  run "$CAP" python3 -m engine serve-trace --out "$R" "${extra[@]}" "$@"
}
for part in "$@"; do
  gpu=${part#*@}; [ "$gpu" = "$part" ] && gpu=0; part=${part%@*}
  export CUDA_VISIBLE_DEVICES=$gpu
  case $part in
    seed)
      if [ -n "${DURATION:-}" ]; then size=(--duration "$DURATION"); else size=(--requests "${REQUESTS:-50}"); fi
      served --rates "${RATES:-1,3,5,7,15,30,60}" "${size[@]}" --name seed ;;
    azure) served --trace "$AZURE" --window "$WINDOW" --rate-scale "${SCALES:-16,32}" --name azure ;;
    azure1x) served --trace "$AZURE" --window "${AZURE_1X:-1200:1380}" --name azure-1x ;;
    capacity) served --trace "$AZURE" --window "$WINDOW" --rate-scale "${SCALES:-7,8,9,9.375,10,10.375,11}" --name azure-cap ;;
    *) echo "unknown part $part (seed azure azure1x capacity)"; exit 2 ;;
  esac
done
echo "elapsed ${SECONDS}s"
tar czf "$OUT/results.tgz" -C "$(dirname "$R")" "$(basename "$R")"
