"""Whole decode passes of batches that fill the GPU priced with decode attention as a
bandwidth-shared schedule of the kernel's programs (`sim/schedule.py`), fitted here on the sweep,
beside a cost model (`--cost`): the trial of that schedule as the cost model's term
(`results/calibration/h200-waves.json`, the calibration before it, prices those batches by the
form's waves, which see a batch by its mean and longest context; `calibrated:h200` by the
schedule as `calibrate fit --schedule` fitted it).

Fitted on the calibration's sweep (its decode passes of padded batches of 128 and more, each
time rested by the calibration's heat factor) as `calibrate fit --schedule` fits it
(`calibrate.fit.schedule_fit`): the schedule's three times (bandwidth, a block alone, a program's
start; over the 528 resident programs) by least squares on relative error, each padded batch's
graph time the median of what the schedule leaves of that batch's passes. Then
every open run's logged decode passes of such batches (`results/continuous/`), priced with the
calibration's heat as the simulator prices them, in total against their logged time, beside the
cost model's price.

    python benchmarks/fluid_priced.py [--cost calibrated:h200]     # about a minute
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from calibrate.fit import schedule_fit  # noqa: E402
from calibrate.replay import engine_runs  # noqa: E402
from core.config import get_preset  # noqa: E402
from core.runstore import RunStore  # noqa: E402
from sim.cost import parse_cost  # noqa: E402
from sim.heat import factors  # noqa: E402


def fills(cost, p) -> bool:
    return p.kind == "decode" and len(p.new_tokens) > 1 and cost.fills(len(p.new_tokens))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    ap.add_argument("--cost", default="calibrated:h200")
    args = ap.parse_args(argv)
    cost, _ = parse_cost(args.cost)
    layers = get_preset(cost.model).num_hidden_layers
    store = RunStore(args.results / "calibration")
    sweep_id = next(r["run_id"] for r in reversed(store.rows()) if r.get("kind") == "sweep")
    sweep = store.passes(sweep_id)
    rows = [dataclasses.replace(p, duration_s=p.duration_s / f)  # rested
            for p, f in zip(sweep, factors(sweep, cost.heat)) if fills(cost, p)]
    rates, graphs = schedule_fit(rows, cost)
    ours = copy.deepcopy(cost)  # the same model, its full batches as scheduled here
    ours.schedule, ours.graph_s = rates, {**cost.graph_s, **graphs}
    rested = np.array([p.duration_s for p in rows])
    spread = np.array([len(set(p.context_lens)) > 1 for p in rows])
    errors = {name: np.array(c.predict_all(rows)) / rested - 1
              for name, c in (("the cost model", cost), ("schedule + graph time per batch", ours))}
    print(f"sweep {sweep_id}: {len(rows)} decode passes of batches that fill the GPU; the schedule over "
          f"{cost.decode_wave} resident: {rates['kv_gbs'] / 1e3:.2f} TB/s shared, a block alone "
          f"{rates['block_s'] / layers * 1e6:.2f} us, a program's start {rates['start_s'] / layers * 1e6:.2f} us (a layer)")
    print(f"  {'':<34}{'MAPE':>7}{'one context':>13}{'spread':>8}{'spread, mean':>14}")
    for name, e in errors.items():
        print(f"  {name:<34}{np.mean(np.abs(e)):>7.2%}{np.mean(np.abs(e[~spread])):>13.2%}"
              f"{np.mean(np.abs(e[spread])):>8.2%}{np.mean(e[spread]):>+14.2%}")
    totals = defaultdict(lambda: np.zeros(4))
    for run_store, row in engine_runs(args.results, cost.gpu, cost.model):
        if run_store.root.name != "continuous":
            continue
        passes = run_store.passes(row["run_id"])
        rid = row["run_id"]
        group = ("Azure, capacity window" if rid.startswith("azure-cap") else
                 "Azure, 16x and 32x" if rid.startswith("azure") else "seed workload")
        for p, f in zip(passes, factors(passes, cost.heat)):
            if fills(cost, p):
                totals[group] += (1, p.duration_s, cost.pass_time(p.new_tokens, p.context_lens) * f,
                                  ours.pass_time(p.new_tokens, p.context_lens) * f)
    print("open runs' logged decode passes of batches that fill the GPU, priced with heat / logged - 1:")
    print(f"  {'':<24}{'passes':>7}{'the cost model':>16}{'schedule':>10}")
    for group, (n, logged, model_s, ours_s) in sorted(totals.items()):
        print(f"  {group:<24}{int(n):>7}{model_s / logged - 1:>+16.2%}{ours_s / logged - 1:>+10.2%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
