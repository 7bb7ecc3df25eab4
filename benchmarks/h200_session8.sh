#!/usr/bin/env bash
# The eighth continuous-engine session's device calls, by part (the device tool's copy of the tree
# has no .git, so each call sets GIT_COMMIT):
#   GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/h200_session8.sh PART...
# (`bash benchmarks/device_tree.sh aside` before the call, `... back` after it; the capacity runs this
# reads are among those it sets aside, and the device tool copies no file of a tracked path set aside: copy the
# three named below into an untracked folder and name it, RUNS=that/continuous)
# Parts:
#   kneegap   where the runs at the capacity knee lose their passes' time (the model prices their logged
#             passes 2-3.4% short: chunked prefill's mixed passes 3-4%, continuous batching's decode batches
#             of 65-127 2-3.4%): 600 middle passes of three of them timed again (benchmarks/replay_shapes.py)
#             in the sweep's windows of 16 and all back to back, nvidia-smi's clocks beside them: the Azure
#             window with chunked prefill at 10.25x, with continuous batching at 9.125x and at 8x (where
#             the prompt passes are priced right and the decode batches of 65-127 still 2.7% short)
#   mixedgrid the GPU tests, then `calibrate sweep --grid mixed` (mixed passes as the chunked policy builds them
#             on the Azure trace, beside the default grid's own mixed passes), 5 repeats, and the chunked run's
#             600 middle passes timed again on the same card (its served mixed passes beside the grid)
source benchmarks/device_prelude.sh
for part in "$@"; do
  export CUDA_VISIBLE_DEVICES=0
  case $part in
    kneegap)
      for run in azure-cap-chunked-20261130T161406 azure-cap-continuous-20261130T161117 azure-cap-continuous-20261130T154734; do
        run 200 python3 benchmarks/replay_shapes.py ${RUNS:-results/continuous}/$run --passes 600 --long-window 600 \
          --telemetry $R/replay-$run-telemetry.csv --json $R/replay-$run.json
      done
      gzip $R/*.csv $R/*.json ;;
    mixedgrid)
      run 400 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_gpu.py tests/test_calibrate_sweep.py
      run 300 python3 -m calibrate sweep --grid mixed --repeats 5 --out $R
      run 200 python3 benchmarks/replay_shapes.py ${RUNS:-results/continuous}/azure-cap-chunked-20261130T161406 --passes 600 \
        --json $R/replay-mixedgrid-azure-cap-chunked-20261130T161406.json
      gzip $R/*.json
      tar czf $OUT/results.tgz -C $OUT results ;;  # (the sweep's run folder is deeper than the device tool returns)
    *) echo "unknown part $part" ;;
  esac
done
echo "elapsed ${SECONDS}s"
