#!/usr/bin/env bash
# The continuous engine on one H200: the measurements committed under results/, by part, so that
# each device call runs the parts that fit it. The device tool's copy of the tree has no .git:
#   GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/h200_continuous.sh tests sweep seed
#   GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/h200_continuous.sh closed azure
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
R=$OUT/results
mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee $R/gpu.txt
run() { local cap=$1; shift; echo "== $* (cap ${cap}s, at ${SECONDS}s)"; timeout $cap "$@" 2>&1 | tr '\r' '\n' | grep -vE '%\||^ *$' | tail -30; }
AZURE=${AZURE:-azure-conv-2023}  # a path when the machine has no copy of ../shared
for part in "$@"; do
  case $part in
    tests) run 200 python3 -m pytest tests/test_gpu.py tests/test_kernels.py -q -x -rA -s -p no:cacheprovider ;;
    kerneltests) run 200 python3 -m pytest tests/test_kernels.py tests/test_gpu.py -k "paged or chunk or continuous" -q -x -rA -s -p no:cacheprovider ;;
    sweep) run 240 python3 -m calibrate sweep --out $R ;;
    seed) run 330 python3 -m engine serve-trace --rates 1,3,5,7,15,30,60 --requests 50 --policy continuous,chunked --out $R ;;
    saturate) run 150 python3 -m engine serve-trace --rates 120,240,480 --requests 400 --policy continuous,chunked --out $R ;;
    closed)
      run 120 python3 -m engine bench --engine continuous --prompts p256 --batch-size 1,2,4,8,16,32,64,128,256 --warmup 1 --runs 3 --out $R
      run 60 python3 -m engine bench --engine continuous --prompts p16,p64,p1024,p4096 --warmup 1 --runs 3 --out $R ;;
    azure)
      run 200 python3 -m engine serve-trace --trace $AZURE --window 1200:1260 --policy continuous,chunked --out $R --name azure-1x
      run 200 python3 -m engine serve-trace --trace $AZURE --window 1200:1520 --rate-scale 16,32 --policy continuous,chunked --out $R --name azure ;;
    *) echo "unknown part $part" ;;
  esac
done
echo "elapsed ${SECONDS}s"
tar czf $OUT/results.tgz -C $OUT results
