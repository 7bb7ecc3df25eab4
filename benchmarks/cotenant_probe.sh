#!/usr/bin/env bash
# Does a process on the other GPU of an nvidia-h200-x2 machine change this GPU's pass times?
# The first heat run (results/calibration/heat-20261130T062743) saw its rested decode probe step
# from 2.173 to 2.065 ms at the moment a closed-run benchmark on the other GPU exited. Here GPU 0
# runs one round of `python -m calibrate heat` (rested probes in every sequence) while GPU 1 is
# idle for its first 50 s, then runs a closed benchmark (model load, then p256 at batch 64-256),
# then is idle again; marks.txt has the wall times of GPU 1's start and exit.
#   GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/cotenant_probe.sh     (on nvidia-h200-x2; writes $OUT/all.tgz)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps .whl/*.whl 2>&1 | tail -1
mark() { echo "$1 $(date +%s.%N)" >> $OUT/marks.txt; }
mark start
(CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m calibrate heat --repeats 1 --rest 0.5 --out $OUT/drift > $OUT/g0.log 2>&1
 mark g0_done) &
sleep 50
mark g1_start
CUDA_VISIBLE_DEVICES=1 timeout 200 python3 -m engine bench --engine continuous --prompts p256 --batch-size 64,128,256 \
  --warmup 1 --runs 2 --out $OUT/cotenant > $OUT/g1.log 2>&1
mark g1_exit
wait
tar czf $OUT/all.tgz -C $OUT drift cotenant marks.txt g0.log g1.log
tail -3 $OUT/g0.log; tail -3 $OUT/g1.log; cat $OUT/marks.txt
