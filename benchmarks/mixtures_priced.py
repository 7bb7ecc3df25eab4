"""Decode batches of spread contexts against their twins of one context, priced by the cost model:
the runs of `python -m calibrate sweep --grid mixtures` (results/calibration-mixtures). For each
batch size, the median of each shape's timed passes over the model's price, for the spread
batches and for their twins (one context, the batch's mean), and the spread batches' time over
their twins' measured and priced: how much a batch's spread of contexts costs, on the GPU and in
the model.

    python benchmarks/mixtures_priced.py                          # every run there (about 2 s)
    python benchmarks/mixtures_priced.py --cost calibrated:h200 DIR
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from calibrate.mixtures import pairs, shape_medians  # noqa: E402
from core.runstore import RunStore  # noqa: E402
from sim.cost import parse_cost  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", nargs="?", type=Path, default=ROOT / "results" / "calibration-mixtures")
    ap.add_argument("--cost", default="calibrated:h200")
    args = ap.parse_args(argv)
    store = RunStore(args.dir)
    if not store.rows_path.exists():
        ap.error(f"no runs under {args.dir} (python -m calibrate sweep --grid mixtures --out DIR)")
    try:
        cost = parse_cost(args.cost)[0]
    except ValueError as e:
        ap.error(str(e))
    price = lambda ctx: cost.pass_time([1] * len(ctx), list(ctx))  # noqa: E731
    for row in store.rows():
        print(f"{row['run_id']}: {row['gpu']}, torch {row['torch']}, commit {row['git_commit']}, {row['repeats']} timed "
              f"passes a shape")
        print(f"{'batch':>6} {'spread / price':>15} {'twin / price':>13} {'spread / twin, GPU':>19} {'in the model':>13}")
        for S, rows in sorted(pairs(shape_medians(store.passes(row["run_id"]))).items()):
            spread = np.mean([t / price(c) - 1 for c, t, _, _ in rows])
            twin = np.mean([tt / price(tc) - 1 for _, _, tc, tt in rows])
            gpu = np.mean([t / tt - 1 for _, t, _, tt in rows])
            model = np.mean([price(c) / price(tc) - 1 for c, _, tc, _ in rows])
            print(f"{S:>6} {spread:>+15.1%} {twin:>+13.1%} {gpu:>+19.1%} {model:>+13.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
