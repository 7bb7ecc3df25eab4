#!/usr/bin/env bash
# The seventh continuous-engine session's device calls, by part (the device tool's copy of the tree
# has no .git, so each call sets GIT_COMMIT):
#   GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/h200_session7.sh PART...
# (`bash benchmarks/device_tree.sh aside` before the call, `... back` after it)
# Parts:
#   fluidcheck  decode attention alone (`benchmarks/attention_mixtures.py`) on logged batches of open runs no
#               attention-alone timing has seen yet, to hold out the forms `benchmarks/attention_forms.py` fits
#               on the committed timings: batches of 128 and more from the Azure 16x run, the seed workload at
#               120 req/s and at 200 req/s on two replicas; batches of 2 and more from the Azure trace at its own
#               rate, the seed workload at 120 req/s on two replicas (least outstanding) and the Azure 16x run
source benchmarks/device_prelude.sh
for part in "$@"; do
  export CUDA_VISIBLE_DEVICES=0
  case $part in
    fluidcheck)
      run 300 python3 benchmarks/attention_mixtures.py --passes 40 results/continuous/azure-continuous-20261130T030008 \
        results/continuous/seed-r120-continuous-20261130T045705 \
        results/continuous/seed-continuous-x2-round-robin-20261130T030357 --json $R/attention-mixtures-big.json
      run 240 python3 benchmarks/attention_mixtures.py --min-batch 2 --passes 40 \
        results/continuous/azure-1x-continuous-20261130T044355 \
        results/continuous/seed-r120-continuous-x2-least-outstanding-20261130T090142 \
        results/continuous/azure-continuous-20261130T030008 --json $R/attention-mixtures-small.json ;;
    *) echo "unknown part $part" ;;
  esac
done
echo "elapsed ${SECONDS}s"
