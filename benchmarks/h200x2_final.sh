#!/usr/bin/env bash
# The last device call of the first continuous-engine session: the GPU tests at the final commit
# (on GPU 0), then the two-replica runs again with the fixes their first runs showed were needed
# (a replica walked its waiting queue every pass for a load figure no router it ran with read),
# then one Azure window again with the chunk-attention kernel compiled once for every batch.
#   GIT_COMMIT=$(git rev-parse HEAD) AZURE=.traces/AzureLLMInferenceTrace_conv.csv bash benchmarks/h200x2_final.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$OUT/results
mkdir -p $R
run() { local cap=$1; shift; echo "== $* (cap ${cap}s, at ${SECONDS}s)"; timeout $cap "$@" 2>&1 | tr '\r' '\n' | grep -vE '%\||^ *$' | tail -14; }
CUDA_VISIBLE_DEVICES=0 run 100 python3 -m pytest tests/test_kernels.py tests/test_gpu.py -k "paged or chunk or continuous" -q -p no:cacheprovider
run 70 python3 -m engine serve-trace --rates 200 --requests 300 --replicas 2 --router round-robin,least-outstanding --out $R --name seed
run 110 python3 -m engine serve-trace --trace $AZURE --window 1200:1520 --rate-scale 32 --replicas 2 --router round-robin,least-outstanding --out $R --name azure
CUDA_VISIBLE_DEVICES=0 run 60 python3 -m engine serve-trace --trace $AZURE --window 1200:1520 --rate-scale 16 --out $R --name azure
echo "elapsed ${SECONDS}s"
tar czf $OUT/results.tgz -C $OUT results
