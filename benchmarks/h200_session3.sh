#!/usr/bin/env bash
# The third continuous-engine session's device calls, by part (the device tool's copy of the tree
# has no .git, so each call sets GIT_COMMIT):
#   GIT_COMMIT=$(git rev-parse HEAD) AZURE=.traces/AzureLLMInferenceTrace_conv.csv bash benchmarks/h200_session3.sh PART...
# (the committed results are past the device tool's 64 MiB: `bash benchmarks/device_tree.sh aside` before
# the call sets aside what no part reads, `... back` after it)
# Parts (GPU 0 unless said; on an `nvidia-h200-x2` machine a part suffixed @1 runs on GPU 1; two
# invocations side by side, one a GPU, set TAR=0 and tar $OUT/results themselves when both are done):
#   tests      every GPU test of the kernels and the engine (tests/test_kernels.py, tests/test_gpu.py)
#   profile    benchmarks/profile_paged_decode.py: the batched decode pass, its breakdown, attention slicings
#   replay     benchmarks/replay_shapes.py on seed-r30-continuous: its own passes timed again, as the sweep times
#              passes (its order, shuffled) and as the serving loop launches them
#   replay32   the same on the Azure 32x continuous run (whose passes the calibration under-predicts)
#   served     the seed workload at 30 req/s served again (into $OUT/served, not results/), then its passes replayed
#              as above on the same GPU: tells a harness effect from a machine's or a day's
#   layout     benchmarks/block_layout.py: pass times with KV blocks end to end against scattered over the cache
#   sweep      the calibration sweep
#   sweeplarge the calibration sweep with closed batches' single prompt passes of up to 262,144 tokens
#   sweepserved  the calibration sweep with its timed passes launched as the serving loop launches them (--launch served)
#   closed     the continuous engine's closed runs: p256 at batch 1 to 256, then p16, p64, p1024, p4096 at batch 1
#   seed       the seed's open workload at 1..60 req/s, then 120..480 req/s, both policies
#   seed150    the seed workload at 3..60 req/s with 150 requests a rate (TTFT's percentiles of 50 requests are
#              too few to repeat), both policies; run on both GPUs side by side for repeats
#   azure1x    the Azure conversation window 1200:1250 at its own rate, both policies
#   azure1x3   three minutes of it at its own rate (1200:1380), one policy a GPU at once (x2 machine; about
#              4 minutes; the first attempt's records were lost to a wait loop whose `pgrep -f` matched itself)
#   azure16    the window 1200:1520 compressed 16x, both policies
#   azure32    the same window compressed 32x, both policies
#   replicas   two replicas, one a GPU: the Azure window at 32x and the seed workload at 200 req/s, two routers each
#   replicas2  two replicas: the seed workload at 150 req/s (600 requests), two routers; then the 200 req/s runs of
#              `replicas` again, into $OUT/repeats (for results/continuous-repeats)
#   repeat150  the 150 req/s two-replica runs of `replicas2` again, into $OUT/repeats
#   replicas3  two replicas below saturation: the Azure window at 16x (README's what-if: two H200s serve it
#              within the SLOs) and the seed workload at 120 req/s (60 a replica, 480 requests), two routers each
#   repeat3    the runs of `replicas3` again, into $OUT/repeats
#   heat       `python -m calibrate heat`: designed sequences of prompt and decode passes after rests, with
#              nvidia-smi's clocks beside them (at 624c194 this was benchmarks/heat_response.py, into $OUT/heat)
#   closed5    the `closed` runs with the seed's protocol (2 warm-ups, 5 recorded runs), and the five-prompt mix
#              at batch 192, into $OUT/closed5
#   repeatseed the seed workload with continuous batching at 60 req/s (50 requests) and 120 req/s (400 requests)
#              again, into $OUT/repeats
#   intake     the two-replica seed runs at 150 and 200 req/s again (both routers), now that each request records when
#              its replica took it in and when its first pass started, and one replica at their rates a replica
#              (75 and 100 req/s): does the router's hand-over make two replicas see arrivals later?
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$OUT/results
mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee -a $R/gpu.txt
python3 -m pip install -q --no-deps .whl/*.whl 2>&1 | tail -1
run() { local cap=$1; shift; echo "== $* (cap ${cap}s, at ${SECONDS}s)"; timeout $cap "$@" 2>&1 | tr '\r' '\n' | grep -vE '%\||^ *$' | tail -16; }
AZURE=${AZURE:-azure-conv-2023}
serve="python3 -m engine serve-trace --out $R"
for part in "$@"; do
  gpu=${part#*@}; [ "$gpu" = "$part" ] && gpu=0; part=${part%@*}
  export CUDA_VISIBLE_DEVICES=$gpu
  case $part in
    tests) run 300 python3 -m pytest tests/test_kernels.py tests/test_gpu.py -q -p no:cacheprovider ;;
    profile) run 300 python3 benchmarks/profile_paged_decode.py --json $R/profile_paged_decode.json ;;
    sweep) run 300 python3 -m calibrate sweep --out $R ;;
    sweeplarge) run 300 python3 -m calibrate sweep --max-pass-tokens 262144 --out $R ;;
    sweepserved) run 300 python3 -m calibrate sweep --launch served --out $R ;;
    layout) run 300 python3 benchmarks/block_layout.py --json $R/block_layout.json ;;
    replay) run 300 python3 benchmarks/replay_shapes.py results/continuous-repeats/seed-r30-continuous-20261130T030124 --passes 600 ;;
    replay32) run 300 python3 benchmarks/replay_shapes.py results/continuous/azure-continuous-20261130T030125 --passes 600 ;;
    served)
      run 150 python3 -m engine serve-trace --out $OUT/served --rates 30 --requests 50 --policy continuous
      run 300 python3 benchmarks/replay_shapes.py $OUT/served/continuous/seed-r30-continuous-* --passes 600 ;;
    closed)
      run 200 python3 -m engine bench --engine continuous --prompts p256 --batch-size 1,2,4,8,16,32,64,128,256 --warmup 1 --runs 3 --out $R
      run 150 python3 -m engine bench --engine continuous --prompts p16,p64,p1024,p4096 --warmup 1 --runs 3 --out $R ;;
    seed)
      run 330 $serve --rates 1,3,5,7,15,30,60 --requests 50 --policy continuous,chunked
      run 150 $serve --rates 120,240,480 --requests 400 --policy continuous,chunked ;;
    seed150) run 330 $serve --rates 3,5,7,15,30,60 --requests 150 --policy continuous,chunked ;;
    azure1x) run 200 $serve --trace $AZURE --window 1200:1250 --policy continuous,chunked --name azure-1x ;;
    azure1x3)
      CUDA_VISIBLE_DEVICES=0 run 330 $serve --trace $AZURE --window 1200:1380 --policy continuous --name azure-1x &
      CUDA_VISIBLE_DEVICES=1 run 330 $serve --trace $AZURE --window 1200:1380 --policy chunked --name azure-1x &
      wait ;;
    azure16) run 200 $serve --trace $AZURE --window 1200:1520 --rate-scale 16 --policy continuous,chunked --name azure ;;
    azure32) run 200 $serve --trace $AZURE --window 1200:1520 --rate-scale 32 --policy continuous,chunked --name azure ;;
    replicas)
      unset CUDA_VISIBLE_DEVICES
      run 150 $serve --trace $AZURE --window 1200:1520 --rate-scale 32 --replicas 2 --router round-robin,least-outstanding --name azure
      run 100 $serve --rates 200 --requests 300 --replicas 2 --router round-robin,least-outstanding --name seed
      python3 benchmarks/pass_stalls.py $R/continuous/*x2* ;;
    replicas2)
      unset CUDA_VISIBLE_DEVICES
      run 150 $serve --rates 150 --requests 600 --replicas 2 --router round-robin,least-outstanding
      run 150 python3 -m engine serve-trace --out $OUT/repeats --rates 200 --requests 300 --replicas 2 --router round-robin,least-outstanding --name seed
      python3 benchmarks/pass_stalls.py $R/continuous/*x2* $OUT/repeats/continuous/*x2* ;;
    repeat150)
      unset CUDA_VISIBLE_DEVICES
      run 150 python3 -m engine serve-trace --out $OUT/repeats --rates 150 --requests 600 --replicas 2 --router round-robin,least-outstanding ;;
    replicas3|repeat3)
      unset CUDA_VISIBLE_DEVICES
      [ $part = replicas3 ] && to=$R || to=$OUT/repeats
      run 150 python3 -m engine serve-trace --out $to --trace $AZURE --window 1200:1520 --rate-scale 16 --replicas 2 --router round-robin,least-outstanding --name azure
      run 100 python3 -m engine serve-trace --out $to --rates 120 --requests 480 --replicas 2 --router round-robin,least-outstanding ;;
    heat) run 300 python3 -m calibrate heat --out $R ;;
    closed5)
      bench="python3 -m engine bench --engine continuous --warmup 2 --runs 5 --out $OUT/closed5"
      run 300 $bench --prompts p256 --batch-size 1,2,4,8,16,32,64,128,256
      run 200 $bench --prompts p16,p64,p1024,p4096
      run 100 $bench --prompts mix --batch-size 192 ;;
    repeatseed)
      run 100 python3 -m engine serve-trace --out $OUT/repeats --rates 60 --requests 50 --policy continuous
      run 100 python3 -m engine serve-trace --out $OUT/repeats --rates 120 --requests 400 --policy continuous ;;
    intake)
      unset CUDA_VISIBLE_DEVICES
      run 150 $serve --rates 150 --requests 600 --replicas 2 --router round-robin,least-outstanding
      run 120 $serve --rates 200 --requests 300 --replicas 2 --router round-robin,least-outstanding --name seed
      CUDA_VISIBLE_DEVICES=0 run 120 $serve --rates 75,100 --requests 300 --policy continuous ;;
    *) echo "unknown part $part" ;;
  esac
done
echo "elapsed ${SECONDS}s"
[ "${TAR:-1}" = 1 ] && tar czf $OUT/results.tgz -C $OUT results
