#!/usr/bin/env bash
# The two-replica runs of h200x2_session2b.sh again, after the warm-up's fix (it read its passes'
# times before the clock had a zero).
#   GIT_COMMIT=$(git rev-parse HEAD) AZURE=.traces/AzureLLMInferenceTrace_conv.csv bash benchmarks/h200x2_session2c.sh
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
echo "elapsed ${SECONDS}s"
tar czf $OUT/results.tgz -C $OUT results
