"""Would a table of the prefill graph's own time per token bucket (as decode has `graph_s` per
batch bucket) price prompt passes better? A trial on the sweep, held out as `calibrate fit` holds
it out: the calibration's held-out fit (`held_out_fit`, `held_out_heat`: fitted without the
held-out shape groups) prices every prompt pass run as a graph; each token bucket gets the median
of (rested time - price) over the bucket's fitted passes added; the held-out passes are priced
with and without it.

    python benchmarks/prefill_buckets.py
    python benchmarks/prefill_buckets.py --cost results/calibration/h200.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from calibrate.fit import group_of, held_out, mape  # noqa: E402
from core.runstore import RunStore  # noqa: E402
from sim.calibrated import CalibratedCost, bucket  # noqa: E402
from sim.heat import Heat, factors  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cost", type=Path, default=ROOT / "results" / "calibration" / "h200.json",
                   help="a calibration file with its held-out fit (default the H200's)")
    args = p.parse_args(argv)
    doc = json.loads(args.cost.read_text())
    cost = CalibratedCost(doc | {"parameters": doc["held_out_fit"]}, str(args.cost))
    heat = Heat.from_dict(doc["held_out_heat"], str(args.cost))
    passes = RunStore(args.cost.parent).passes(doc["sweep"])
    rested = np.array([p.duration_s for p in passes]) / np.asarray(factors(passes, heat))
    price = np.array(cost.predict_all(passes))
    out = np.array([held_out(group_of(p), cost.buckets) for p in passes])
    prompt = np.array([p.kind == "prefill" for p in passes])
    m = np.array([bucket(sum(p.new_tokens), cost.token_buckets) for p in passes])
    graph = prompt & ~np.array([cost.eager(b) for b in m])
    table = price.copy()
    print(f"{args.cost.name}: sweep {doc['sweep']}, prompt passes run as graphs: {graph.sum()} "
          f"({(graph & ~out).sum()} fitted, {(graph & out).sum()} held out)")
    print(f"{'bucket':>7} {'fitted':>6} {'held out':>8} {'added':>9}  held-out MAPE without / with")

    for b in cost.token_buckets:
        fit, held = graph & ~out & (m == b), graph & out & (m == b)
        if not fit.any():
            print(f"{b:7d} {0:6d} {held.sum():8d} {'-':>9}  (no fitted pass: left as priced)")
            continue
        added = float(np.median(rested[fit] - price[fit]))
        table[graph & (m == b)] += added
        both = (f"{mape(price[held], rested[held]):6.2%} / {mape(table[held], rested[held]):6.2%}" if held.any()
                else "(none held out)")
        print(f"{b:7d} {fit.sum():6d} {held.sum():8d} {added * 1e3:+7.3f}ms  {both}")
    for name, sel in (("held out", prompt & out), ("fitted", prompt & ~out)):
        print(f"every prompt pass {name}: MAPE {mape(price[sel], rested[sel]):.2%} as calibrated, "
              f"{mape(table[sel], rested[sel]):.2%} with the table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
