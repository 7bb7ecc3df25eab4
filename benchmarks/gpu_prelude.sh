# Sourced by the gpu_*.sh scripts on the GPU machine: the environment, the card's name, driver and
# UUID appended to $OUT/results/gpu.txt, wheels under .whl/ installed if any, `run CAP CMD...` (CMD
# under a timeout of CAP seconds, the last lines of its output) and AZURE (the trace the open runs
# serve windows of: a path, or the name of the known public trace). A tree without .git sets
# GIT_COMMIT for the rows.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
: "${OUT:?set OUT to the directory the results go under}"
R=${RESULTS:-$OUT/results}
mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,uuid --format=csv | tee -a "$R/gpu.txt"
ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-deps .whl/*.whl 2>&1 | tail -1
run() { local cap=$1; shift; echo "== $* (cap ${cap}s, at ${SECONDS}s)"; timeout "$cap" "$@" 2>&1 | tr '\r' '\n' | grep -vE '%\||^ *$' | tail -${TAIL:-16}; }
AZURE=${AZURE:-azure-conv-2023}
