#!/usr/bin/env bash
# Closed decode runs of the continuous engine at the current engine (reused pinned buffers and
# events), and the Azure two-replica runs again after growing the VM's memory first: on this
# machine memory grows as it is first touched (KINDS.md), and both replicas of the previous runs
# stalled about a second at once, mid-run, on passes that had run fast before.
#   GIT_COMMIT=$(git rev-parse HEAD) AZURE=.traces/AzureLLMInferenceTrace_conv.csv bash benchmarks/h200x2_session2d.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$OUT/results
mkdir -p $R
run() { local cap=$1; shift; echo "== $* (cap ${cap}s, at ${SECONDS}s)"; timeout $cap "$@" 2>&1 | tr '\r' '\n' | grep -vE '%\||^ *$' | tail -14; }
AZURE=${AZURE:-azure-conv-2023}
CUDA_VISIBLE_DEVICES=0 run 150 python3 -m engine bench --engine continuous --prompts p256 --batch-size 1,2,4,8,16,32,64,128,256 --warmup 1 --runs 3 --out $R
grep MemTotal /proc/meminfo; python3 -c "b = bytearray(48 << 30); print('touched 48 GiB')"; grep MemTotal /proc/meminfo
run 130 python3 -m engine serve-trace --trace $AZURE --window 1200:1520 --rate-scale 32 --replicas 2 --router round-robin,least-outstanding --out $R --name azure
python3 benchmarks/pass_stalls.py $R/continuous/*x2*
echo "elapsed ${SECONDS}s"
tar czf $OUT/results.tgz -C $OUT results
