#!/usr/bin/env bash
# A look on the device before the full measurement: GPU tests and the decode profile.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem --format=csv
timeout 200 python3 -m pytest tests/test_kernels.py tests/test_gpu.py tests/test_fast_path.py -q -rA -s -p no:cacheprovider > $OUT/tests.log 2>&1
grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed|eager argmax|eager vs graph|^E  " $OUT/tests.log | tail -40
timeout 200 python3 benchmarks/profile_decode.py --no-tune --pdl both --json $OUT/profile.json 2>&1
