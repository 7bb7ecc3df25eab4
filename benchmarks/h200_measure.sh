#!/usr/bin/env bash
# The committed H200 measurements, in one device call (see results/README.md):
# GPU tests first, then each engine's closed runs, most important first, each under a time cap.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
R=$OUT/results
mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee $R/gpu.txt
bench() { local cap=$1; shift; echo "== python -m engine bench $*"; timeout $cap python3 -m engine bench --out $R "$@" 2>&1 | tr '\r' '\n' | grep -vE '%\||^ *$'; }
timeout 80 python3 -m pytest tests/test_gpu.py -q -rA -s -p no:cacheprovider > $R/gpu_tests.log 2>&1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|eager argmax|eager vs graph" $R/gpu_tests.log | tail -20
bench 90 --engine cached
bench 150 --engine batched --prompts p256 --batch-size 1,2,4,8,16,32,64,128,256,512,1024
bench 150 --engine hf --prompts p256
bench 170 --engine naive
left=$((570 - SECONDS)); [ $left -gt 40 ] && bench $left --engine cached --prompts p256 --graphs off
echo "elapsed ${SECONDS}s"
tar czf $OUT/results.tgz -C $OUT results
