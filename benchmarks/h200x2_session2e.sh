#!/usr/bin/env bash
# The two-replica runs once more, with the cyclic garbage collector off while a replica serves
# (the ~1 s launch stalls of h200x2_session2c/2d.sh's Azure runs remained after the VM's memory
# was grown first).
#   GIT_COMMIT=$(git rev-parse HEAD) AZURE=.traces/AzureLLMInferenceTrace_conv.csv bash benchmarks/h200x2_session2e.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$OUT/results
mkdir -p $R
run() { local cap=$1; shift; echo "== $* (cap ${cap}s, at ${SECONDS}s)"; timeout $cap "$@" 2>&1 | tr '\r' '\n' | grep -vE '%\||^ *$' | tail -12; }
AZURE=${AZURE:-azure-conv-2023}
run 130 python3 -m engine serve-trace --trace $AZURE --window 1200:1520 --rate-scale 32 --replicas 2 --router round-robin,least-outstanding --out $R --name azure
run 100 python3 -m engine serve-trace --rates 200 --requests 300 --replicas 2 --router round-robin,least-outstanding --out $R --name seed
python3 benchmarks/pass_stalls.py $R/continuous/*x2*
echo "elapsed ${SECONDS}s"
tar czf $OUT/results.tgz -C $OUT results
