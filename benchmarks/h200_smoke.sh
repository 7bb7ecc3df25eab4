#!/usr/bin/env bash
# A look on the device before the full measurement: GPU tests, decode profile, the HF baseline.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem --format=csv
timeout 200 python3 -m pytest tests/test_kernels.py tests/test_gpu.py -q -p no:cacheprovider 2>&1 | tail -15
timeout 240 python3 benchmarks/profile_decode.py --json $OUT/profile.json
timeout 200 python3 -m engine bench --engine hf --prompts p256 --warmup 1 --runs 1 --out $OUT/r 2>&1 | tr '\r' '\n' | grep -v '%|'
