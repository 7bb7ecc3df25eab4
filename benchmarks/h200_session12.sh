#!/usr/bin/env bash
# The twelfth continuous-engine session's device call (the device tool's copy of the tree has no
# .git, so the call sets GIT_COMMIT):
#   GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/h200_session12.sh long
#   GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/h200_session12.sh long2
#   GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/h200_session12.sh long3
# (`bash benchmarks/device_tree.sh aside` before the call, `... back` after it)
# Parts:
#   long   the seed workload at light and moderate load for 40 seconds of arrivals a rate (5, 15, 30
#          and 60 req/s: 201 to 2,412 requests), continuous batching, then chunked prefill, into
#          $OUT/long for results/continuous: the committed seed runs hold 50 or 150 requests, whose
#          percentiles the engine's own scatter moves by more than the validation's targets (the
#          simulator with the engine's scatter, five seeds, at 60 req/s: TTFT p50 10.9-13.0 ms with
#          150 requests, 18.4-19.4 ms with 1,500)
#   long2  on another card: the 30 and 60 req/s runs of `long` again, both policies, into $OUT/repeats
#          for results/continuous-repeats (how far a long run is from itself on another card); then
#          75 req/s for 40 s (3,035 requests), both policies, into $OUT/long for results/continuous
#   long3  on a third card: the 75 req/s runs of `long2` again (how far a run near saturation is from
#          itself), then the 5 and 15 req/s runs of `long`, both policies, into $OUT/repeats
source benchmarks/device_prelude.sh
for part in "$@"; do
  export CUDA_VISIBLE_DEVICES=0
  case $part in
    long)
      run 290 python3 -m engine serve-trace --out $OUT/long --rates 5,15,30,60 --duration 40 --policy continuous
      run 290 python3 -m engine serve-trace --out $OUT/long --rates 5,15,30,60 --duration 40 --policy chunked
      tar czf $OUT/long.tgz -C $OUT long && rm -rf $OUT/long ;;
    long2)
      run 230 python3 -m engine serve-trace --out $OUT/repeats --rates 30,60 --duration 40 --policy continuous,chunked
      run 150 python3 -m engine serve-trace --out $OUT/long --rates 75 --duration 40 --policy continuous,chunked
      tar czf $OUT/long2.tgz -C $OUT repeats long && rm -rf $OUT/repeats $OUT/long ;;
    long3)
      run 150 python3 -m engine serve-trace --out $OUT/repeats --rates 75 --duration 40 --policy continuous,chunked
      run 230 python3 -m engine serve-trace --out $OUT/repeats --rates 5,15 --duration 40 --policy continuous,chunked
      tar czf $OUT/long3.tgz -C $OUT repeats && rm -rf $OUT/repeats ;;
    *) echo "unknown part $part" ;;
  esac
done
echo "elapsed ${SECONDS}s"
