#!/usr/bin/env bash
# Two replicas again, with each replica's host loop on its own cores and one torch thread, and
# pinned buffers and CUDA events reused instead of made every pass (the 8 / 16 ms stalls of the
# first two-replica runs); meanwhile the GPU tests on GPU 0 and the calibration sweep on GPU 1.
#   GIT_COMMIT=$(git rev-parse HEAD) AZURE=.traces/AzureLLMInferenceTrace_conv.csv bash benchmarks/h200x2_session2.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$OUT/results
mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee $R/gpu.txt
nproc; python3 -c "import os; print('affinity', len(os.sched_getaffinity(0)))"
run() { local cap=$1; shift; echo "== $* (cap ${cap}s, at ${SECONDS}s)"; timeout $cap "$@" 2>&1 | tr '\r' '\n' | grep -vE '%\||^ *$' | tail -14; }
AZURE=${AZURE:-azure-conv-2023}
(CUDA_VISIBLE_DEVICES=0 run 240 python3 -m pytest tests/test_kernels.py tests/test_gpu.py -k "paged or chunk or continuous or reused" -q -p no:cacheprovider > $OUT/tests.log 2>&1) &
[ -n "${SKIP_SWEEP:-}" ] || CUDA_VISIBLE_DEVICES=1 run 300 python3 -m calibrate sweep --out $R
wait
cat $OUT/tests.log
run 100 python3 -m engine serve-trace --rates 200 --requests 300 --replicas 2 --router round-robin,least-outstanding --out $R --name seed
python3 benchmarks/pass_stalls.py $R/continuous/seed-*
run 130 python3 -m engine serve-trace --trace $AZURE --window 1200:1520 --rate-scale 32 --replicas 2 --router round-robin,least-outstanding --out $R --name azure
python3 benchmarks/pass_stalls.py $R/continuous/azure-*
echo "elapsed ${SECONDS}s"
tar czf $OUT/results.tgz -C $OUT results
