#!/usr/bin/env bash
# The fifth continuous-engine session's device calls, by part (the device tool's copy of the tree
# has no .git, so each call sets GIT_COMMIT):
#   GIT_COMMIT=$(git rev-parse HEAD) AZURE=.traces/AzureLLMInferenceTrace_conv.csv bash benchmarks/h200_session5.sh PART...
# (`bash benchmarks/device_tree.sh aside` before the call, `... back` after it)
# Parts:
#   capacity   the simulator's capacity answer checked on the engine: the Azure window 1200:1520 served at rate
#              scales around the scale the calibrated simulator finds one H200 can take within p99 TTFT 200 ms
#              and p99 TPOT 20 ms (continuous 9.125, chunked 10.5: `python -m sim capacity` on that window, without
#              --overlap; as the engine runs, with it, 9.375 and 10.375: benchmarks/capacity_check.py):
#              continuous at 7, 8, 9 and 10 times the trace's rate, chunked at 8, 9, 10 and 11 (into
#              $OUT/results/continuous)
#   capacity2  the engine at the simulator's answer (without --overlap) itself, on the same window: continuous at 9.125 times the
#              rate and chunked at 10.5 (each twice: once into $OUT/results/continuous, once into $OUT/repeats for
#              results/continuous-repeats), and continuous at 9.5 (between the 9 and 10 that capacity ran)
#   capacity3  the knee on one card: the runs at 9.125x and 10.5x went to another H200 than the first call's, whose
#              passes the model prices about a point shorter, so the engine's capacity is measured again in one
#              call: continuous at 9, 9.125, 9.25 and 9.375 (the simulator's answer with --overlap), chunked at
#              10, 10.25 and 10.375 (its answer)
#   capacityx2 (an nvidia-h200-x2 machine) two replicas, one a GPU, around the simulator's capacity answer for two
#              H200s on the same window (--replicas 2 --overlap: continuous 18.25x with round-robin and 18.75x with
#              least-outstanding, chunked 21.25x with least-outstanding): continuous at 17 and 19 times with both
#              routers, chunked at 20 and 22 times with least-outstanding
#   mixtures3  benchmarks/attention_mixtures.py on the small and middle decode batches (2 sequences and more) of
#              three seed runs at 30, 60 and 100 req/s, whose whole passes the model prices 1.5-2.5% long at
#              9-32 sequences and 1-5% short at 65-256
source benchmarks/device_prelude.sh
for part in "$@"; do
  export CUDA_VISIBLE_DEVICES=0
  case $part in
    capacity)
      run 270 python3 -m engine serve-trace --out $R --trace $AZURE --window 1200:1520 --rate-scale 7,8,9,10 \
        --policy continuous --name azure-cap
      run 250 python3 -m engine serve-trace --out $R --trace $AZURE --window 1200:1520 --rate-scale 8,9,10,11 \
        --policy chunked --name azure-cap ;;
    capacity2)
      run 150 python3 -m engine serve-trace --out $R --trace $AZURE --window 1200:1520 --rate-scale 9.125,9.5 \
        --policy continuous --name azure-cap
      run 100 python3 -m engine serve-trace --out $R --trace $AZURE --window 1200:1520 --rate-scale 10.5 \
        --policy chunked --name azure-cap
      run 100 python3 -m engine serve-trace --out $OUT/repeats --trace $AZURE --window 1200:1520 --rate-scale 9.125 \
        --policy continuous --name azure-cap
      run 100 python3 -m engine serve-trace --out $OUT/repeats --trace $AZURE --window 1200:1520 --rate-scale 10.5 \
        --policy chunked --name azure-cap ;;
    capacity3)
      run 250 python3 -m engine serve-trace --out $R --trace $AZURE --window 1200:1520 --rate-scale 9,9.125,9.25,9.375 \
        --policy continuous --name azure-cap
      run 200 python3 -m engine serve-trace --out $R --trace $AZURE --window 1200:1520 --rate-scale 10,10.25,10.375 \
        --policy chunked --name azure-cap ;;
    capacityx2)
      unset CUDA_VISIBLE_DEVICES
      run 280 python3 -m engine serve-trace --out $R --trace $AZURE --window 1200:1520 --rate-scale 17,19 \
        --policy continuous --replicas 2 --router round-robin,least-outstanding --name azure-cap
      run 160 python3 -m engine serve-trace --out $R --trace $AZURE --window 1200:1520 --rate-scale 20,22 \
        --policy chunked --replicas 2 --router least-outstanding --name azure-cap ;;
    mixtures3) run 120 python3 benchmarks/attention_mixtures.py --min-batch 2 --passes 40 \
                 results/continuous/seed-r30-continuous-20261130T045643 results/continuous/seed-r60-continuous-20261130T045648 \
                 results/continuous/seed-r100-continuous-20261130T120012 --json $R/attention_mixtures3.json ;;
    *) echo "unknown part $part" ;;
  esac
done
echo "elapsed ${SECONDS}s"
tar czf $OUT/results.tgz -C $OUT results $(cd $OUT && ls -d repeats 2>/dev/null)
