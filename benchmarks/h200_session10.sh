#!/usr/bin/env bash
# The tenth continuous-engine session's device call (the device tool's copy of the tree has no .git,
# so the call sets GIT_COMMIT):
#   AZURE=.traces/AzureLLMInferenceTrace_conv.csv GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/h200_session10.sh heldout
# (`bash benchmarks/device_tree.sh aside` before the call, `... back` after it; .traces/ carried with
# the trace in it: the device machine cannot download it)
# Parts:
#   heldout  the calibration's heat slow-downs are fitted on the open runs before the capacity runs
#            since 5063f99 (`calibrate fit --serving-heat`): runs on a card none of them ran on, of
#            configurations already under results/continuous (so into $OUT/repeats, for
#            results/continuous-repeats): the seed workload at 100 req/s (300 requests) and 120 req/s
#            (400 requests) with continuous batching, at 60 req/s (150 requests) with chunked prefill,
#            and the Azure window at 9 times its rate (continuous) and 10 times (chunked)
source benchmarks/device_prelude.sh
for part in "$@"; do
  export CUDA_VISIBLE_DEVICES=0
  case $part in
    heldout)
      run 120 python3 -m engine serve-trace --out $OUT/repeats --rates 100 --requests 300 --policy continuous
      run 120 python3 -m engine serve-trace --out $OUT/repeats --rates 120 --requests 400 --policy continuous
      run 100 python3 -m engine serve-trace --out $OUT/repeats --rates 60 --requests 150 --policy chunked
      run 150 python3 -m engine serve-trace --out $OUT/repeats --trace $AZURE --window 1200:1520 --rate-scale 9 \
        --policy continuous --name azure-cap
      run 150 python3 -m engine serve-trace --out $OUT/repeats --trace $AZURE --window 1200:1520 --rate-scale 10 \
        --policy chunked --name azure-cap
      tar czf $OUT/repeats.tgz -C $OUT repeats && rm -rf $OUT/repeats ;;
    *) echo "unknown part $part" ;;
  esac
done
echo "elapsed ${SECONDS}s"
