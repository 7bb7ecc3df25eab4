#!/usr/bin/env bash
# The second continuous-engine session's device calls on an `nvidia-h200-x2` machine, by part,
# so that each call runs the parts that fit it (the device tool's copy of the tree has no .git):
#   GIT_COMMIT=$(git rev-parse HEAD) AZURE=.traces/AzureLLMInferenceTrace_conv.csv bash benchmarks/h200x2_session2.sh PART...
# Parts and the calls that ran them (commit):
#   tests      the GPU tests of the paged kernels, the continuous engine and the host buffers, on GPU 0
#   sweep      the calibration sweep on GPU 1 (9b16fcf, beside `tests`)
#   replicas   two replicas, one a GPU: the seed workload at 200 req/s and an Azure window at 32x, two
#              routers each, then each run's stall figures (9b16fcf, b4505ab, ac4fc83; committed: 564a659)
#   chunked32  the Azure 32x window on GPU 0 alone with chunked prefill (4e74f60)
#   mix        static `batched` against `continuous` on batches of 192 of the seed's five prompts (4e74f60)
#   closed     the continuous engine's closed p256 decode runs, batch 1 to 256 (ac4fc83)
#   grow       touch 48 GiB of host memory first: this VM's memory grows as it is first used (ac4fc83)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$OUT/results
mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee $R/gpu.txt
run() { local cap=$1; shift; echo "== $* (cap ${cap}s, at ${SECONDS}s)"; timeout $cap "$@" 2>&1 | tr '\r' '\n' | grep -vE '%\||^ *$' | tail -14; }
AZURE=${AZURE:-azure-conv-2023}
for part in "$@"; do
  case $part in
    tests) CUDA_VISIBLE_DEVICES=0 run 240 python3 -m pytest tests/test_kernels.py tests/test_gpu.py \
             -k "paged or chunk or continuous or reused or warm_up" -q -p no:cacheprovider ;;
    sweep) CUDA_VISIBLE_DEVICES=1 run 300 python3 -m calibrate sweep --out $R ;;
    replicas)
      run 130 python3 -m engine serve-trace --trace $AZURE --window 1200:1520 --rate-scale 32 --replicas 2 --router round-robin,least-outstanding --out $R --name azure
      run 100 python3 -m engine serve-trace --rates 200 --requests 300 --replicas 2 --router round-robin,least-outstanding --out $R --name seed
      python3 benchmarks/pass_stalls.py $R/continuous/*x2* ;;
    chunked32) CUDA_VISIBLE_DEVICES=0 run 100 python3 -m engine serve-trace --trace $AZURE --window 1200:1520 --rate-scale 32 --policy chunked --out $R --name azure ;;
    mix)
      CUDA_VISIBLE_DEVICES=0 run 150 python3 -m engine bench --engine batched --prompts mix --batch-size 192 --warmup 1 --runs 2 --out $R
      CUDA_VISIBLE_DEVICES=0 run 100 python3 -m engine bench --engine continuous --prompts mix --batch-size 192 --warmup 1 --runs 2 --out $R ;;
    closed) CUDA_VISIBLE_DEVICES=0 run 150 python3 -m engine bench --engine continuous --prompts p256 --batch-size 1,2,4,8,16,32,64,128,256 --warmup 1 --runs 3 --out $R ;;
    grow) grep MemTotal /proc/meminfo; python3 -c "b = bytearray(48 << 30); print('touched 48 GiB')" ;;
    *) echo "unknown part $part" ;;
  esac
done
echo "elapsed ${SECONDS}s"
tar czf $OUT/results.tgz -C $OUT results
