#!/usr/bin/env bash
# Closed runs of the engines on one GPU (results/<engine>/runs.jsonl, the table of results/README.md),
# by part; each part's runs under a time cap:
#   OUT=/tmp/o bash benchmarks/gpu_closed_runs.sh tests cached batched hf naive eager continuous mix
# Parts:
#   tests       the GPU tests (tests/test_gpu.py, tests/test_kernels.py)
#   cached      the KV-cached engine, batch 1, every prompt of the part0 workload (or CACHED_PROMPTS)
#   batched     the static batch of p256 at BATCHES (default 1,2,...,1024)
#   hf          Hugging Face generate (static cache, compiled) on p256
#   naive       no KV cache, every prompt
#   eager       the cached engine's p256 without CUDA graphs (--graphs off)
#   continuous  the continuous engine: p256 at CONT_BATCHES (default 1,...,256), then CONT_PROMPTS (default
#               p16,p64,p1024,p4096; empty for none)
#   mix         the five prompts of the part0 workload at batch 192, continuous and batched engines
# WARMUP (default 2) and RUNS (default 5) set the protocol, MODEL the model (a preset or a config.json,
# default qwen2.5-1.5b); the rows go under $OUT/results.
. "$(dirname "$0")/gpu_prelude.sh"
WARMUP=${WARMUP:-2} RUNS=${RUNS:-5}
BATCHES=${BATCHES:-1,2,4,8,16,32,64,128,256,512,1024}
CONT_BATCHES=${CONT_BATCHES:-1,2,4,8,16,32,64,128,256}
bench="python3 -m engine bench --out $R --warmup $WARMUP --runs $RUNS --model ${MODEL:-qwen2.5-1.5b}"
for part in "$@"; do
  case $part in
    tests) TAIL=60 run "${TESTS_CAP:-300}" python3 -m pytest tests/test_gpu.py tests/test_kernels.py -q -rfEs -p no:cacheprovider ;;
    cached) run 120 $bench --engine cached ${CACHED_PROMPTS:+--prompts $CACHED_PROMPTS} ;;
    batched) run 200 $bench --engine batched --prompts p256 --batch-size "$BATCHES" ;;
    hf) run 200 $bench --engine hf --prompts p256 ;;
    naive) run 240 $bench --engine naive ;;
    eager) run 120 $bench --engine cached --prompts p256 --graphs off ;;
    continuous)
      run 200 $bench --engine continuous --prompts p256 --batch-size "$CONT_BATCHES"
      [ -n "${CONT_PROMPTS-p16,p64,p1024,p4096}" ] && run 120 $bench --engine continuous --prompts "${CONT_PROMPTS-p16,p64,p1024,p4096}" ;;
    mix)
      run 120 $bench --engine continuous --prompts mix --batch-size 192
      run 120 $bench --engine batched --prompts mix --batch-size 192 ;;
    *) echo "unknown part $part (tests cached batched hf naive eager continuous mix)"; exit 2 ;;
  esac
done
echo "elapsed ${SECONDS}s"
tar czf "$OUT/results.tgz" -C "$(dirname "$R")" "$(basename "$R")"
