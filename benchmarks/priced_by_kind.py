"""The open runs' logged passes against their price, by kind of pass: each calibration's price
(heat included, as the simulator runs it: `sim.heat.logged_times`) over the logged time, less 1,
summed over the passes of each kind, for the runs the calibration's heat slow-downs are fitted
on (`calibrate fit --serving-heat` at 5063f99: the runs under results/continuous then, but the
capacity check's `azure-cap-*`; h200.json's `runs_read` names them), for the capacity runs, held
out of that fit, and for the runs measured after it (the long seed runs of 2026-12-01 evening);
with --runs, run by run; with
--dir continuous-repeats, the runs measured again (every one held out; those of 2026-12-01 on
cards none of the fitted runs ran on), --only picking runs by a part of their id.

    python benchmarks/priced_by_kind.py --cost results/calibration/h200-heat-run.json --cost calibrated:h200
    python benchmarks/priced_by_kind.py --dir continuous-repeats --only 20261201T03 --runs --cost results/calibration/h200-heat-run.json --cost calibrated:h200
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.runstore import RunStore  # noqa: E402
from sim.cost import parse_cost  # noqa: E402
from sim.heat import logged_times  # noqa: E402

KINDS = ("decode", "prefill", "mixed")


def priced(passes, cost) -> dict:
    """{kind: (price, logged)} summed over the passes of each kind."""
    price = np.array(logged_times(cost, passes))
    logged = np.array([p.duration_s for p in passes])
    kind = np.array([p.kind for p in passes])
    return {k: (price[kind == k].sum(), logged[kind == k].sum()) for k in KINDS if (kind == k).any()}


def line(sums: dict) -> str:
    return "  ".join(f"{k} {sums[k][0] / sums[k][1] - 1:+6.2%}" if k in sums else f"{k} {'-':>6}" for k in KINDS)


FIT = ROOT / "results" / "calibration" / "h200.json"  # the calibration whose `--serving-heat` fit the groups follow


@functools.cache
def fitted_runs() -> frozenset:
    """The runs of results/continuous the committed calibration's fit read (its `runs_read`)."""
    return frozenset(json.loads(FIT.read_text())["runs_read"]["continuous"])


def fitted_on(run_id: str) -> bool:
    """Whether the `--serving-heat` fit read this run of results/continuous."""
    return run_id in fitted_runs()


def group_of(run_id: str, folder: str) -> str:
    """Which side of the `--serving-heat` fit a run is on: under continuous/ the capacity runs are
    held out of it, runs started after it too, and the others fitted on; every run elsewhere
    (repeats) is held out."""
    if folder != "continuous":
        return f"{folder} (held out)"
    if fitted_on(run_id):
        return "fitted on (not azure-cap-*)"
    return "held out (azure-cap-*)" if run_id.startswith("azure-cap") else "held out (measured after the fit)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default=str(ROOT / "results"), help="where the runs are (default results)")
    p.add_argument("--dir", default="continuous", help="the runs' folder under RESULTS (default continuous)")
    p.add_argument("--only", default="", help="only runs whose id contains this")
    p.add_argument("--cost", action="append", help="a calibration (name or file); repeat to compare (default calibrated:h200)")
    p.add_argument("--runs", action="store_true", help="also every run on its own")
    args = p.parse_args(argv)
    costs = [(spec, parse_cost(spec)[0]) for spec in args.cost or ["calibrated:h200"]]
    store = RunStore(Path(args.results) / args.dir)
    groups: dict = {}  # {group: {cost spec: {kind: (price, logged)}}}
    for row in store.rows():
        if args.only not in row["run_id"]:
            continue
        passes = store.passes(row["run_id"])
        group = groups.setdefault(group_of(row["run_id"], args.dir), {})
        for spec, cost in costs:
            sums = priced(passes, cost)
            if args.runs:
                print(f"{row['run_id'][:56]:56s} {spec:40s} {line(sums)}")
            total = group.setdefault(spec, {})
            for k, (a, b) in sums.items():
                total[k] = (total.get(k, (0.0, 0.0))[0] + a, total.get(k, (0.0, 0.0))[1] + b)
    print("price / logged - 1, by kind of pass, summed over the runs:")
    width = max(map(len, groups), default=0)
    for name, by_cost in sorted(groups.items()):
        for spec, sums in by_cost.items():
            print(f"  {name:{width}s} {spec:40s} {line(sums)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
