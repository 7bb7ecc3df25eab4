#!/usr/bin/env bash
# A look on the device before the full measurement: GPU tests, decode profile, one benchmark point.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem --format=csv
timeout 240 python3 -m pytest tests/test_kernels.py tests/test_gpu.py tests/test_fast_path.py -q -rA -s -p no:cacheprovider > $OUT/tests.log 2>&1
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|eager argmax|eager vs graph" $OUT/tests.log | tail -40
timeout 260 python3 benchmarks/profile_decode.py --json $OUT/profile.json 2>&1 | grep -v skipped
timeout 60 python3 -m engine bench --engine cached --prompts p256 --warmup 1 --runs 2 --out $OUT/r 2>&1 | tr '\r' '\n' | grep -E "cached +p256"
