#!/usr/bin/env bash
# The fourth continuous-engine session's device calls, by part (the device tool's copy of the tree
# has no .git, so each call sets GIT_COMMIT):
#   GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/h200_session4.sh PART...
# (`bash benchmarks/device_tree.sh aside` before the call, `... back` after it)
# Parts:
#   mixtures   benchmarks/attention_mixtures.py: decode attention alone on the served batches of two re-timed runs,
#              against the same contexts sorted and against one context of their mean
#   sweepgap   600 of the calibration sweep's own passes timed again as it timed them and all back to back: how much
#              the sweep's shapes themselves slow when the GPU is kept busy (what a sweep without rests would fit)
#   sustained  benchmarks/sustained_load.py: designed sequences of 10-20 s (big decodes, small decodes, prompts,
#              prompts alternating with big decodes) with the clocks beside them: does the GPU slow over seconds?
#   mixtures2  the same on designed mixtures at 32-512 sequences and on four more open runs' logged batches
#   servegap   what serving adds over the sweep's windows: the Azure window at 16x and the seed workload at
#              100 req/s served (into $OUT/servegap, not results/) with nvidia-smi's clocks, power and
#              temperature sampled every 20 ms beside them, then each run's 600 middle passes timed again
#              (benchmarks/replay_shapes.py) in the sweep's windows of 16 and in one window of all 600 back
#              to back, with the clocks beside those too: does a GPU kept busy run the same passes slower?
#   stages150  the seed workload at 3, 7 and 60 req/s with 150 requests, both policies, again (into $OUT/repeats,
#              for results/continuous-repeats), now that each request records its intake and first pass: where
#              do the simulated TTFT medians at low load (5.6-5.7% long at 3 and 7 req/s) take their time?
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
R=$OUT/results
mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee -a $R/gpu.txt
python3 -m pip install -q --no-deps .whl/*.whl 2>&1 | tail -1
run() { local cap=$1; shift; echo "== $* (cap ${cap}s, at ${SECONDS}s)"; timeout $cap "$@" 2>&1 | tr '\r' '\n' | grep -vE '%\||^ *$' | tail -16; }
mark() { echo "$1 $(date +%s.%N)" >> $2; }
AZURE=${AZURE:-azure-conv-2023}
FIELDS=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
for part in "$@"; do
  export CUDA_VISIBLE_DEVICES=0
  case $part in
    servegap)
      G=$OUT/servegap; mkdir -p $G
      nvidia-smi --query-gpu=$FIELDS --format=csv -lms 20 -i 0 > $G/serve-telemetry.csv 2>/dev/null & smi=$!
      mark azure-start $G/marks.txt
      run 200 python3 -m engine serve-trace --out $G --trace $AZURE --window 1200:1520 --rate-scale 16 --policy continuous --name azure
      mark azure-end $G/marks.txt
      sleep 5
      mark seed-start $G/marks.txt
      run 100 python3 -m engine serve-trace --out $G --rates 100 --requests 300 --policy continuous
      mark seed-end $G/marks.txt
      kill $smi
      for run in $G/continuous/azure-continuous-* $G/continuous/seed-r100-continuous-*; do
        name=$(basename $run)
        run 300 python3 benchmarks/replay_shapes.py $run --passes 600 --long-window 600 \
          --telemetry $G/replay-$name-telemetry.csv --json $G/replay-$name.json
      done
      gzip $G/*.csv $G/*.json ;;
    stages150) run 330 python3 -m engine serve-trace --out $OUT/repeats --rates 3,7,60 --requests 150 --policy continuous,chunked ;;
    mixtures) run 300 python3 benchmarks/attention_mixtures.py results/calibration-replays/replay-azure-continuous-20261130T135321.json.gz \
                results/calibration-replays/replay-seed-r100-continuous-20261130T135413.json.gz --passes 40 --json $R/attention_mixtures.json ;;
    mixtures2) run 300 python3 benchmarks/attention_mixtures.py --designed --passes 20 \
                 results/continuous/azure-continuous-20261130T030125 results/continuous/seed-r75-continuous-20261130T120007 \
                 results/continuous/seed-r150-continuous-x2-round-robin-20261130T050711 \
                 results/continuous/azure-continuous-x2-round-robin-20261130T085949 --json $R/attention_mixtures2.json ;;
    sweepgap) run 400 python3 benchmarks/replay_shapes.py results/calibration/sweep-20261130T105802 --passes 600 --long-window 600 \
                --json $R/replay-sweep-20261130T105802.json ;;
    sustained) run 300 python3 benchmarks/sustained_load.py --json $R/sustained.json ;;
    *) echo "unknown part $part" ;;
  esac
done
echo "elapsed ${SECONDS}s"
tar czf $OUT/results.tgz -C $OUT results $(cd $OUT && ls -d servegap repeats 2>/dev/null)
