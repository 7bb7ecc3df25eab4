#!/usr/bin/env bash
# On two H200s (kind nvidia-h200-x2): the Azure windows on one replica (GPU 0), then two replicas
# behind the router on both GPUs, for the seed workload and an Azure window that load both.
#   GIT_COMMIT=$(git rev-parse HEAD) AZURE=.traces/AzureLLMInferenceTrace_conv.csv bash benchmarks/h200x2_replicas.sh single cluster
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
R=$OUT/results
mkdir -p $R
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv | tee $R/gpu.txt
run() { local cap=$1; shift; echo "== $* (cap ${cap}s, at ${SECONDS}s)"; timeout $cap "$@" 2>&1 | tr '\r' '\n' | grep -vE '%\||^ *$' | tail -20; }
AZURE=${AZURE:-azure-conv-2023}
for part in "$@"; do
  case $part in
    single)
      CUDA_VISIBLE_DEVICES=0 run 150 python3 -m engine serve-trace --trace $AZURE --window 1200:1250 --policy continuous,chunked --out $R --name azure-1x
      CUDA_VISIBLE_DEVICES=0 run 150 python3 -m engine serve-trace --trace $AZURE --window 1200:1520 --rate-scale 16,32 --policy continuous,chunked --out $R --name azure ;;
    cluster)
      run 150 python3 -m engine serve-trace --rates 200 --requests 300 --replicas 2 --router ${ROUTERS:-round-robin,least-outstanding} --out $R --name seed
      run 200 python3 -m engine serve-trace --trace $AZURE --window 1200:1520 --rate-scale 32 --replicas 2 --router ${ROUTERS:-round-robin,least-outstanding} --out $R --name azure ;;
    *) echo "unknown part $part" ;;
  esac
done
echo "elapsed ${SECONDS}s"
tar czf $OUT/results.tgz -C $OUT results
