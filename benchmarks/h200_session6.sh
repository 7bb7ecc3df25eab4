#!/usr/bin/env bash
# The sixth continuous-engine session's device calls, by part (the device tool's copy of the tree
# has no .git, so each call sets GIT_COMMIT):
#   GIT_COMMIT=$(git rev-parse HEAD) AZURE=.traces/AzureLLMInferenceTrace_conv.csv bash benchmarks/h200_session6.sh PART...
# (`bash benchmarks/device_tree.sh aside` before the call, `... back` after it)
# Parts:
#   cardheat   is a card's speed at the knee its heat? Three H200s ran the capacity window's passes 0.7-1.3
#              points apart as the model prices them, most where the card was hot (the cold decode passes of
#              their runs within 0.2-1.1%). On one card in one call: its heat response (`python -m calibrate
#              heat --repeats 1`, into $OUT/cards, not beside the calibration's sweep: `calibrate fit` takes
#              the latest heat run there), then the Azure window 1200:1520 around the simulator's capacity
#              answers (continuous at 9, 9.25 and 9.5 times the trace's rate, chunked at 10, 10.25 and 10.5;
#              into $OUT/results/continuous)
#   samecard   the same question with the runs the card's heat moves the other way: with the heat the first
#              call's card measured (prefill 13.3% at full heat, against the calibration's 12.3%, and faster
#              rise and fall), the simulator's capacity answers fall inside every card's interval, but the
#              moderately loaded seed runs (older cards) go long. On one card: its heat run (into $OUT/cards),
#              then the seed workload at 3 req/s (50 requests, continuous), 60 req/s (150 requests, both
#              policies) and 120 req/s (400 requests, continuous), and the Azure window at 9.25 (continuous)
#              and 10.25 times (chunked): each a configuration already under results/continuous, so into
#              $OUT/repeats for results/continuous-repeats
#   heat2card  the same with a heat run of two rounds (one round's kappas scatter by 1-2 points): its heat, then
#              the seed workload at 60 req/s (150 requests, both policies) and 120 req/s (400 requests), the
#              window at 9 and 9.25 times (continuous) and 10 and 10.25 (chunked), into $OUT/repeats
#   mixtures4  whole decode passes of spread contexts beside their twins of one context (the batch's mean) at
#              40-256 sequences (`python -m calibrate sweep --grid mixtures`, into $OUT/mixtures, not beside the
#              calibration's sweep): served batches of 65-127 sequences run 2-3% over their price
source benchmarks/device_prelude.sh
mkdir -p $OUT/cards
for part in "$@"; do
  export CUDA_VISIBLE_DEVICES=0
  case $part in
    cardheat)
      run 150 python3 -m calibrate heat --repeats 1 --out $OUT/cards
      run 200 python3 -m engine serve-trace --out $R --trace $AZURE --window 1200:1520 --rate-scale 9,9.25,9.5 \
        --policy continuous --name azure-cap
      run 200 python3 -m engine serve-trace --out $R --trace $AZURE --window 1200:1520 --rate-scale 10,10.25,10.5 \
        --policy chunked --name azure-cap ;;
    samecard)
      run 150 python3 -m calibrate heat --repeats 1 --out $OUT/cards
      run 120 python3 -m engine serve-trace --out $OUT/repeats --rates 3 --requests 50 --policy continuous
      run 100 python3 -m engine serve-trace --out $OUT/repeats --rates 60 --requests 150 --policy continuous,chunked
      run 100 python3 -m engine serve-trace --out $OUT/repeats --rates 120 --requests 400 --policy continuous
      run 100 python3 -m engine serve-trace --out $OUT/repeats --trace $AZURE --window 1200:1520 --rate-scale 9.25 \
        --policy continuous --name azure-cap
      run 100 python3 -m engine serve-trace --out $OUT/repeats --trace $AZURE --window 1200:1520 --rate-scale 10.25 \
        --policy chunked --name azure-cap ;;
    heat2card)
      run 200 python3 -m calibrate heat --repeats 2 --out $OUT/cards
      run 100 python3 -m engine serve-trace --out $OUT/repeats --rates 60 --requests 150 --policy continuous,chunked
      run 100 python3 -m engine serve-trace --out $OUT/repeats --rates 120 --requests 400 --policy continuous
      run 150 python3 -m engine serve-trace --out $OUT/repeats --trace $AZURE --window 1200:1520 --rate-scale 9,9.25 \
        --policy continuous --name azure-cap
      run 150 python3 -m engine serve-trace --out $OUT/repeats --trace $AZURE --window 1200:1520 --rate-scale 10,10.25 \
        --policy chunked --name azure-cap ;;
    mixtures4) run 300 python3 -m calibrate sweep --grid mixtures --max-batch 256 --out $OUT/mixtures ;;
    *) echo "unknown part $part" ;;
  esac
done
echo "elapsed ${SECONDS}s"
tar czf $OUT/results.tgz -C $OUT results cards $(cd $OUT && ls -d repeats mixtures 2>/dev/null)
