"""The open runs' decode passes against their price (heat included, as the simulator prices them),
by how busy the GPU had been before each (an exponential average of its busy time, time constant
--tau) and by batch size: does a GPU kept busy for long run decode slower than the model says?
Runs of one replica under RESULTS/continuous; the weighted least-squares slope of logged / priced - 1
on the busy level, over the passes the calibration's heat slow-downs are fitted on (every run but
the capacity check's `azure-cap-*` and those measured after the fit: `priced_by_kind.fitted_on`).

    python benchmarks/busy_decode.py --tau 1
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.priced_by_kind import fitted_on  # noqa: E402
from core.runstore import RunStore  # noqa: E402
from sim.cost import parse_cost  # noqa: E402
from sim.heat import logged_times  # noqa: E402

LEVELS = ((0.0, 0.5), (0.5, 0.8), (0.8, 0.95), (0.95, 1.01))
BATCHES = ((2, 48), (49, 144), (145, 1024))


def busy_levels(passes, tau: float) -> list[float]:
    """The busy level at each pass's start (passes in time order): rises towards 1 while a pass
    runs and falls towards 0 while the GPU idles, both with time constant tau."""
    out, level, end = [], 0.0, None
    for p in passes:
        if end is not None:
            level *= math.exp(-max(0.0, p.start_s - end) / tau)
        out.append(level)
        level = 1 + (level - 1) * math.exp(-p.duration_s / tau)
        end = p.start_s + p.duration_s
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=str(ROOT / "results"))
    ap.add_argument("--cost", default="calibrated:h200")
    ap.add_argument("--tau", type=float, default=1.0, help="the busy level's time constant, seconds (default 1)")
    args = ap.parse_args(argv)
    cost = parse_cost(args.cost)[0]
    store = RunStore(Path(args.results) / "continuous")
    rows = []  # (fitted on, batch, busy level, logged, priced)
    for row in store.rows():
        if row.get("replicas", 1) != 1:
            continue
        passes = sorted(store.passes(row["run_id"]), key=lambda p: p.start_s)
        for p, level, price in zip(passes, busy_levels(passes, args.tau), logged_times(cost, passes)):
            if p.kind == "decode" and len(p.new_tokens) > 1:
                rows.append((fitted_on(row["run_id"]), len(p.new_tokens), level, p.duration_s, price))
    fitted, batch, level, logged, priced = (np.array(c) for c in zip(*rows))
    print(f"decode passes of one-replica open runs, logged / priced - 1 (summed), by busy level (tau {args.tau:g} s):")
    print(f"{'busy level':>12s}" + "".join(f"{f'batch {lo}-{hi}':>22s}" for lo, hi in BATCHES))
    for lo, hi in LEVELS:
        cells = []
        for blo, bhi in BATCHES:
            sel = (level >= lo) & (level < hi) & (batch >= blo) & (batch <= bhi)
            cells.append(f"{logged[sel].sum() / priced[sel].sum() - 1:+.2%} ({sel.sum()})" if sel.sum() >= 200 else "-")
        print(f"{f'{lo:.2f}-{min(hi, 1):.2f}':>12s}" + "".join(f"{c:>22s}" for c in cells))
    x, y, w = level[fitted], logged[fitted] / priced[fitted] - 1, np.sqrt(logged[fitted])
    slope, intercept = np.linalg.lstsq(np.c_[x, np.ones_like(x)] * w[:, None], y * w, rcond=None)[0]
    print(f"least squares over the fitted runs' decode passes: logged / priced - 1 = {slope:+.4f} x busy "
          f"{intercept:+.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
