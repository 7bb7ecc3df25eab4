#!/usr/bin/env bash
# The ninth continuous-engine session's device calls, by part (the device tool's copy of the tree
# has no .git, so each call sets GIT_COMMIT):
#   GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/h200_session9.sh PART...
# (`bash benchmarks/device_tree.sh aside` before the call, `... back` after it)
# Parts:
#   heat   a heat run with the sequences the committed one lacks (`mixed 60, b256`, `decode b256 c1000`
#          and `serving chunked`, held out like `serving`): the chunked runs' logged mixed passes run
#          slower than rested by about half what the heat model gives them at its hottest, and its
#          `serving` sequence runs 1.5-2% under its price (`python -m calibrate heat`, into
#          $R/calibration, tarred: its run folder is deeper than the device tool returns)
#   gputests  the GPU test suite (kernels, the engine on the GPU, the calibration sweep)
source benchmarks/device_prelude.sh
for part in "$@"; do
  export CUDA_VISIBLE_DEVICES=0
  case $part in
    heat)
      run 420 python3 -m calibrate heat --out $R
      tar czf $OUT/results.tgz -C $OUT results ;;
    gputests)
      run 500 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_gpu.py tests/test_calibrate_sweep.py ;;
    *) echo "unknown part $part" ;;
  esac
done
echo "elapsed ${SECONDS}s"
