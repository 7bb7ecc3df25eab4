#!/usr/bin/env bash
# Regenerates the small traces committed for the project's results. Run from the repo root.
# The two Poisson traces share their seed, so they have the same gaps at different scales:
# only the rate differs between them. tests/test_traces_cli.py checks these files still match.
set -euo pipefail
python -m traces generate poisson --rate 2 --n 300 --prompt 256 --output 256 --seed 0 --out traces/data/poisson_p256_r2.csv
python -m traces generate poisson --rate 8 --n 300 --prompt 256 --output 256 --seed 0 --out traces/data/poisson_p256_r8.csv
python -m traces generate fixed --rate 1 --n 200 --seed 0 --out traces/data/fixed_prompts_r1.csv
