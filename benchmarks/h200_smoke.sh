#!/usr/bin/env bash
# First look on the device: versions, GPU tests, batch-1 kernel profile, a few benchmark points.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem --format=csv
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
timeout 240 python3 -m pytest tests/test_kernels.py tests/test_gpu.py -x -q -p no:cacheprovider 2>&1 | tail -25
timeout 150 python3 benchmarks/profile_decode_b1.py --json $OUT/b1.json
timeout 150 python3 -m engine bench --engine cached --prompts p16,p256,p4096 --warmup 1 --runs 2 --out $OUT/r 2>&1 | grep -v '%|'
timeout 120 python3 -m engine bench --engine batched --prompts p256 --batch-size 2,64,256 --warmup 1 --runs 1 --out $OUT/r 2>&1 | grep -v '%|'
