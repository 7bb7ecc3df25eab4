"""The mixed grid (`calibrate sweep --grid mixed`, results/calibration-mixed/) priced by cost models:
its served-like mixed passes against the calibration sweep's own mixed shapes timed beside them,
each pass priced with heat along the grid's own order, and by decodes beside the chunk.

    python benchmarks/mixed_grid_priced.py [--cost SPEC ...] [--run RUN_ID]

(default: the calibration before cb25aa2, results/calibration/h200-mixed-waves.json, and
calibrated:h200; the latest sweep-mixed run; about 2 s)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.runstore import RunStore  # noqa: E402
from sim.cost import parse_cost  # noqa: E402
from sim.heat import factors  # noqa: E402

DECODES = ((16, 32), (64, 96), (128, 192), (256, 256))


def key(p) -> tuple:
    return tuple(sorted(zip(p.context_lens, p.new_tokens)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cost", nargs="+", default=[str(ROOT / "results/calibration/h200-mixed-waves.json"),
                                                  "calibrated:h200"])
    ap.add_argument("--run", default=None)
    args = ap.parse_args(argv)
    store = RunStore(ROOT / "results" / "calibration-mixed")
    runs = [r for r in store.rows() if r.get("kind") == "sweep-mixed"]
    row = runs[-1] if args.run is None else next((r for r in runs if r["run_id"] == args.run), None)
    if row is None:
        print(f"error: no sweep-mixed run {args.run or ''} under {store.root}", file=sys.stderr)
        return 2
    grid = store.passes(row["run_id"])
    costs = [(spec, parse_cost(spec)[0]) for spec in args.cost]
    own = {}
    for p in RunStore(ROOT / "results" / "calibration").passes(sweep_of(args.cost[-1])):
        if p.kind == "mixed":
            own.setdefault(key(p), []).append(p.duration_s)
    anchors = np.array([key(p) in own for p in grid])
    raw = np.median([p.duration_s / np.median(own[key(p)]) for p in grid if key(p) in own])
    print(f"{row['run_id']} ({row['gpu']}, {row['git_commit']}): {anchors.sum()} passes of the calibration sweep's "
          f"mixed shapes, {len(grid) - anchors.sum()} served-like; on the shapes both timed this card took {raw:.4f} of "
          f"the calibration card's time")
    decodes = np.array([sum(1 for n in p.new_tokens if n == 1) for p in grid])
    times = np.array([p.duration_s for p in grid])
    for spec, cost in costs:
        priced = np.array([cost.pass_time(p.new_tokens, p.context_lens) for p in grid]) * np.array(factors(grid, cost.heat))
        err = priced / times - 1
        a, s = np.median(err[anchors]), np.median(err[~anchors])
        print(f"{spec}: priced / timed - 1, the sweep's shapes {a:+.2%}, served-like {s:+.2%} (MAPE "
              f"{np.mean(np.abs(err[~anchors])):.2%}): served-like against the sweep's {(1 + s) / (1 + a) - 1:+.2%}; by decodes "
              + ", ".join(f"{lo}-{hi} {np.median(err[~anchors & (decodes >= lo) & (decodes <= hi)]):+.1%}"
                          for lo, hi in DECODES))
    return 0


def sweep_of(spec: str) -> str:
    """The calibration sweep a cost spec's file (a path or calibrated:NAME) was fitted on."""
    path = Path(spec) if Path(spec).exists() else ROOT / "results" / "calibration" / f"{spec.split(':', 1)[1]}.json"
    return json.loads(path.read_text())["sweep"]


if __name__ == "__main__":
    sys.exit(main())
