#!/usr/bin/env bash
# The eleventh continuous-engine session's device calls (the device tool's copy of the tree has no
# .git, so the call sets GIT_COMMIT):
#   AZURE=.traces/AzureLLMInferenceTrace_conv.csv GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/h200_session11.sh knee
#   AZURE=.traces/AzureLLMInferenceTrace_conv.csv GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/h200_session11.sh azure1x
# (`bash benchmarks/device_tree.sh aside` before a call, `... back` after it; .traces/ carried with
# the trace in it: the device machine cannot download it)
# Parts (runs of configurations already under results/continuous that were measured once, below
# saturation, so into $OUT/repeats, for results/continuous-repeats: the validation's "against the
# real runs' range" then covers them):
#   knee     the capacity window (1200:1520) on one H200 at the scales measured only once: continuous
#            batching at 7, 8, 10 and 9.375 times its rate, chunked prefill at 8, 9, 11 and 10.375
#   azure1x  three minutes of the trace at its own rate (1200:1380), continuous, then chunked
#   large    the seed's closed runs of p256 at the two batch sizes results/batched has and
#            ../continuous-closed has not, 512 and 1024 (2 warm-ups, 5 recorded runs), into
#            $OUT/large for results/continuous-closed-large/ (not read by `calibrate fit`)
#   inarow   the sweep's tests on the GPU (run_sweep's in_a_row is new), then on one card the default
#            grid once in the sweep's windows and once with each shape 6 times in a row, launched as
#            served (`--in-a-row 6 --launch served`): whether a shape timed back to back runs slower than
#            in the windows, by decode bucket; into $OUT/inarow (kinds sweep and sweep-in-a-row)
source benchmarks/device_prelude.sh
for part in "$@"; do
  export CUDA_VISIBLE_DEVICES=0
  case $part in
    knee)
      run 290 python3 -m engine serve-trace --out $OUT/repeats --trace $AZURE --window 1200:1520 \
        --rate-scale 7,8,10,9.375 --policy continuous --name azure-cap
      run 270 python3 -m engine serve-trace --out $OUT/repeats --trace $AZURE --window 1200:1520 \
        --rate-scale 8,9,11,10.375 --policy chunked --name azure-cap
      tar czf $OUT/repeats-knee.tgz -C $OUT repeats && rm -rf $OUT/repeats ;;
    azure1x)
      run 280 python3 -m engine serve-trace --out $OUT/repeats --trace $AZURE --window 1200:1380 --policy continuous \
        --name azure-1x
      run 280 python3 -m engine serve-trace --out $OUT/repeats --trace $AZURE --window 1200:1380 --policy chunked \
        --name azure-1x
      tar czf $OUT/repeats-azure1x.tgz -C $OUT repeats && rm -rf $OUT/repeats ;;
    large)
      run 400 python3 -m engine bench --engine continuous --warmup 2 --runs 5 --prompts p256 --batch-size 512,1024 \
        --out $OUT/large
      tar czf $OUT/large.tgz -C $OUT large && rm -rf $OUT/large ;;
    inarow)
      run 150 python3 -m pytest -q -p no:cacheprovider tests/test_calibrate_sweep.py
      run 200 python3 -m calibrate sweep --repeats 1 --out $OUT/inarow
      run 330 python3 -m calibrate sweep --repeats 1 --in-a-row 6 --launch served --out $OUT/inarow
      tar czf $OUT/inarow.tgz -C $OUT inarow && rm -rf $OUT/inarow ;;
    *) echo "unknown part $part" ;;
  esac
done
echo "elapsed ${SECONDS}s"
