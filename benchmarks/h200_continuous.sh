#!/usr/bin/env bash
# The continuous engine on one H200, in one device call: its GPU tests, the calibration sweep,
# its closed runs (the static engine's configurations), and a short open run.
# Usage (the device tool's copy of the tree has no .git): GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/h200_continuous.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
R=$OUT/results
mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee $R/gpu.txt
run() { local cap=$1; shift; echo "== $* (cap ${cap}s, at ${SECONDS}s)"; timeout $cap "$@" 2>&1 | tr '\r' '\n' | grep -vE '%\||^ *$' | tail -40; }
run 240 python3 -m pytest tests/test_gpu.py tests/test_kernels.py -q -x -rA -s -p no:cacheprovider
run 240 python3 -m calibrate sweep --out $R
run 150 python3 -m engine bench --engine continuous --prompts p256 --batch-size 1,2,4,8,16,32,64,128,256 --warmup 1 --runs 3 --out $R
run 90 python3 -m engine bench --engine continuous --prompts p16,p64,p1024,p4096 --warmup 1 --runs 3 --out $R
run 100 python3 -m engine serve-trace --rates 4 --requests 40 --out $R
echo "elapsed ${SECONDS}s"
tar czf $OUT/results.tgz -C $OUT results
