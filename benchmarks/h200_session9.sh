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
#   cold      a closed run's TTFT is its first pass on an idle GPU, and the closed runs' TTFT medians miss the
#             replay by 3-11% at 3 of 14 configurations; open runs' passes after a sleep ran 0.07 ms over their
#             price after under 5 ms idle, 0.52 after 5-20 ms, 0.64 after more: a cold GPU. The designed runs of
#             benchmarks/cold_start.py (rests of 0-1,000 ms before p16, p256, p1024), then the seed's closed runs
#             again with each run's idle time recorded (`idle_before_s`, bench since this commit), into
#             $OUT/closed (tarred)
source benchmarks/device_prelude.sh
for part in "$@"; do
  export CUDA_VISIBLE_DEVICES=0
  case $part in
    heat)
      run 420 python3 -m calibrate heat --out $R
      tar czf $OUT/results.tgz -C $OUT results ;;
    cold)
      run 200 python3 benchmarks/cold_start.py --json $R/cold-start.json
      run 200 python3 -m engine bench --engine continuous --warmup 2 --runs 5 --prompts p256 \
        --batch-size 1,2,4,8,16,32,64,128,256 --out $OUT/closed
      run 150 python3 -m engine bench --engine continuous --warmup 2 --runs 5 --prompts p16,p64,p1024,p4096 --out $OUT/closed
      run 150 python3 -m engine bench --engine continuous --warmup 2 --runs 5 --prompts mix --batch-size 192 --out $OUT/closed
      tar czf $OUT/closed.tgz -C $OUT closed && rm -rf $OUT/closed ;;
    gputests)
      run 500 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_gpu.py tests/test_calibrate_sweep.py ;;
    *) echo "unknown part $part" ;;
  esac
done
echo "elapsed ${SECONDS}s"
