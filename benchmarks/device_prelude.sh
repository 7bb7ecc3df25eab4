# Sourced by the device session scripts (benchmarks/h200_session5.sh, h200_session6.sh) on the GPU
# machine: the environment, the card's name and UUID appended to $OUT/results/gpu.txt, the carried
# wheels (.whl/) installed, `run CAP CMD...` (CMD under a timeout of CAP seconds, its output's last
# lines) and AZURE (the trace the calls serve windows of).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
R=$OUT/results
mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,uuid --format=csv | tee -a $R/gpu.txt
python3 -m pip install -q --no-deps .whl/*.whl 2>&1 | tail -1
run() { local cap=$1; shift; echo "== $* (cap ${cap}s, at ${SECONDS}s)"; timeout $cap "$@" 2>&1 | tr '\r' '\n' | grep -vE '%\||^ *$' | tail -16; }
AZURE=${AZURE:-azure-conv-2023}
