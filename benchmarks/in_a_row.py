"""A sweep's shapes timed back to back against the same shapes in the sweep's windows, on one card:
`calibrate sweep --in-a-row K --launch served` (each shape K times in a row, its batch built once)
beside a plain `calibrate sweep` run of the same grid, by kind of pass and decode batch (graph
bucket), and both against the calibration's rested price of each shape. The first of each K
follows a host that built a new batch; the 2nd to Kth are the GPU's alone, back to back.

    python benchmarks/in_a_row.py results/calibration-inarow
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.runstore import RunStore  # noqa: E402
from sim.calibrated import CalibratedCost, bucket  # noqa: E402

GROUPS = ((1, "decode, batch 1"), (48, "decode, 2-48"), (144, "decode, 56-144"), (256, "decode, 152-256"),
          (10 ** 9, "decode, 264-1024"))


def group_of(p, buckets) -> str:
    if p.kind != "decode":
        return p.kind
    b = bucket(len(p.new_tokens), buckets)
    return next(name for top, name in GROUPS if b <= top)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="a results folder whose calibration/ holds both sweeps")
    ap.add_argument("--cost", default="results/calibration/h200.json", help="the calibration to set them against")
    args = ap.parse_args(argv)
    store = RunStore(args.results / "calibration")
    rows = store.rows()
    try:
        windowed = next(r for r in rows if r["kind"] == "sweep")
        in_a_row = next(r for r in rows if r["kind"] == "sweep-in-a-row")
    except StopIteration:
        print(f"error: {store.root}: needs a sweep and a sweep-in-a-row run", file=sys.stderr)
        return 2
    cost = CalibratedCost.from_json(args.cost)
    key = lambda p: (tuple(p.new_tokens), tuple(p.context_lens))  # noqa: E731
    alone = {key(p): p.duration_s for p in store.passes(windowed["run_id"])}
    k = in_a_row["in_a_row"]
    passes = store.passes(in_a_row["run_id"])
    by_group: dict[str, list] = {}
    for i in range(0, len(passes), k):
        run = passes[i:i + k]
        first = run[0]
        if key(first) not in alone:
            continue
        later = statistics.median(p.duration_s for p in run[1:])
        price = cost.pass_time(first.new_tokens, first.context_lens)
        by_group.setdefault(group_of(first, cost.buckets), []).append(
            (later / alone[key(first)], first.duration_s / alone[key(first)], later / price, alone[key(first)] / price))
    print(f"{windowed['run_id']} (windows) and {in_a_row['run_id']} ({k} in a row, launched {in_a_row['launch']}) "
          f"on {in_a_row['gpu']}, commit {in_a_row['git_commit'][:7]}; medians over the shapes:")
    print(f"{'passes':18s} {'shapes':>6s}  {'2nd-{k}th / windows':>18s}  {'1st / windows':>13s}  {'2nd-{k}th / price':>16s}"
          f"  {'windows / price':>15s}".replace("{k}", str(k)))
    order = [name for _, name in GROUPS] + ["prefill", "mixed"]
    for name in sorted(by_group, key=order.index):
        a = np.array(by_group[name])
        print(f"{name:18s} {len(a):6d}  {np.median(a[:, 0]) - 1:+18.2%}  {np.median(a[:, 1]) - 1:+13.2%}  "
              f"{np.median(a[:, 2]) - 1:+16.2%}  {np.median(a[:, 3]) - 1:+15.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
