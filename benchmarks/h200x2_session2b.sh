#!/usr/bin/env bash
# After 9b16fcf's two-replica runs: the first Azure 32x two-replica run stalled about a second
# on each of several passes of more than 8,192 tokens, compiling the kernels such passes launch
# one by one; the engine now runs a few such passes before serving (ModelRunner.warm_up). The
# two-replica runs again; the Azure 32x chunked run on one GPU (missing since the first session);
# and the static engine against the continuous one on batches of the seed's five prompts in turn.
#   GIT_COMMIT=$(git rev-parse HEAD) AZURE=.traces/AzureLLMInferenceTrace_conv.csv bash benchmarks/h200x2_session2b.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$OUT/results
mkdir -p $R
run() { local cap=$1; shift; echo "== $* (cap ${cap}s, at ${SECONDS}s)"; timeout $cap "$@" 2>&1 | tr '\r' '\n' | grep -vE '%\||^ *$' | tail -12; }
AZURE=${AZURE:-azure-conv-2023}
CUDA_VISIBLE_DEVICES=0 run 120 python3 -m pytest tests/test_gpu.py -k "warm_up or reused" -q -p no:cacheprovider
run 100 python3 -m engine serve-trace --rates 200 --requests 300 --replicas 2 --router round-robin,least-outstanding --out $R --name seed
run 130 python3 -m engine serve-trace --trace $AZURE --window 1200:1520 --rate-scale 32 --replicas 2 --router round-robin,least-outstanding --out $R --name azure
python3 benchmarks/pass_stalls.py $R/continuous/*x2*
CUDA_VISIBLE_DEVICES=0 run 100 python3 -m engine serve-trace --trace $AZURE --window 1200:1520 --rate-scale 32 --policy chunked --out $R --name azure
CUDA_VISIBLE_DEVICES=0 run 150 python3 -m engine bench --engine batched --prompts mix --batch-size 192 --warmup 1 --runs 2 --out $R
CUDA_VISIBLE_DEVICES=0 run 100 python3 -m engine bench --engine continuous --prompts mix --batch-size 192 --warmup 1 --runs 2 --out $R
echo "elapsed ${SECONDS}s"
tar czf $OUT/results.tgz -C $OUT results
