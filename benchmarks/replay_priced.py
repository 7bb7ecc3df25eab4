"""A run's own passes re-timed by `benchmarks/replay_shapes.py --json`, against the cost model:
per kind of pass, each column's total time (logged in the run, timed again as the calibration
sweep times passes in its own order and shuffled, and as the serving loop launches them) over
the model's price with heat at the levels of the logged run (`sim.heat.logged_times`), and how
much of that price is heat; and, for files that record each column's span (since 26daa49), each
column against heat along its own timeline. The run is an open run or a calibration sweep.
Where the sweep's columns match the price but the logged times do not, serving adds what the
sweep does not see; where the sweep's columns miss it too, the cost model misses the shapes
themselves.

    python benchmarks/replay_priced.py [FILE ...] [--cost calibrated:h200]

(default: every replay-*.json.gz under results/calibration-replays/)
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.records import PassRecord  # noqa: E402
from core.runstore import RunStore  # noqa: E402
from sim.cost import parse_cost  # noqa: E402
from sim.heat import Heat, factors, logged_times  # noqa: E402

WINDOW = 16  # calibrate.sweep.run_sweep's windows (the sweep's columns)


def groups(passes: list[dict]) -> list[tuple[str, np.ndarray]]:
    kind = np.array([p["kind"] for p in passes])
    batch = np.array([len(p["new_tokens"]) for p in passes])
    tokens = np.array([sum(p["new_tokens"]) for p in passes])
    dec = kind == "decode"
    return [("decode b1-64", dec & (batch <= 64)), ("decode b65-199", dec & (batch > 64) & (batch < 200)),
            ("decode b200+", dec & (batch >= 200)), ("prompt <= 8192 tokens", ~dec & (tokens <= 8192)),
            ("prompt > 8192 tokens", ~dec & (tokens > 8192)), ("all", np.ones(len(passes), bool))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path, help="replay_shapes.py --json files (.json or .json.gz; default "
                    "every replay-*.json.gz under results/calibration-replays)")
    ap.add_argument("--cost", default="calibrated:h200")
    ap.add_argument("--results", type=Path, default=ROOT / "results", help="where the replayed runs are")
    args = ap.parse_args(argv)
    cost, _ = parse_cost(args.cost)
    files = args.files or sorted((ROOT / "results" / "calibration-replays").glob("replay-*.json.gz"))
    if not files:
        print("error: no replay files given, and none under results/calibration-replays", file=sys.stderr)
        return 2
    for f in files:
        opener = gzip.open if f.suffix == ".gz" else open
        with opener(f, "rt") as fh:
            d = json.load(fh)
        passes = d["passes"]
        store = next((RunStore(args.results / sub) for sub in ("continuous", "continuous-repeats", "calibration")
                      if (args.results / sub / d["run"]).is_dir()), None)
        if store is None:
            print(f"error: {f}: run {d['run']} is not under {args.results}/continuous(-repeats) or calibration",
                  file=sys.stderr)
            return 2
        logged = sorted(store.passes(d["run"]), key=lambda p: p.start_s)
        mid = max(0, len(logged) // 2 - len(passes) // 2)  # replay_shapes' passes: the middle of the run
        mine = logged[mid:mid + len(passes)]
        if [list(p.new_tokens) for p in mine] != [q["new_tokens"] for q in passes]:
            print(f"error: {f}: its passes are not the middle of {d['run']}'s log", file=sys.stderr)
            return 2
        priced = np.array(logged_times(cost, logged))[mid:mid + len(passes)] * 1e3
        rested = np.array([cost.pass_time(q["new_tokens"], q["context_lens"]) for q in passes]) * 1e3
        columns = [k for k in passes[0] if k not in ("kind", "context_lens", "new_tokens")]  # the times it holds
        times = {k: np.array([q[k] for q in passes]) for k in columns}
        print(f"{d['run']} ({len(passes)} passes re-timed on {d['gpu']} at {d['git_commit']}): "
              f"total time / the model's price with heat - 1")
        print(f"  {'passes':<22}{'n':>5}{'heat':>8}" + "".join(f"{k:>{max(18, len(k) + 2)}}" for k in columns))
        for name, sel in groups(passes):
            if sel.sum() < 3:
                continue
            price = priced[sel].sum()
            print(f"  {name:<22}{sel.sum():>5}{price / rested[sel].sum() - 1:>+8.1%}"
                  + "".join(f"{times[k][sel].sum() / price - 1:>+{max(18, len(k) + 2)}.1%}" for k in columns))
        if "spans" in d:  # (files since 26daa49): each column against heat along its own timeline
            own = {k: own_heat(cost, passes, k, d["spans"].get(k), times[k]) for k in columns if k != "logged"}
            own = {"logged": priced / rested, **{k: v for k, v in own.items() if v is not None}}
            print("  each column's total time / the model's price with heat along that column's own timeline - 1 "
                  "(heat's share in brackets):")
            print(f"  {'passes':<22}{'n':>5}        " + "".join(f"{k:>{max(20, len(k) + 2)}}" for k in own))
            for name, sel in groups(passes):
                if sel.sum() < 3:
                    continue
                print(f"  {name:<22}{sel.sum():>5}        " + "".join(
                    f"{times[k][sel].sum() / (rested[sel] * f[sel]).sum() - 1:+.1%} "
                    f"({(rested[sel] * f[sel]).sum() / rested[sel].sum() - 1:+.1%})".rjust(max(20, len(k) + 2))
                    for k, f in own.items()))
    return 0


def own_heat(cost, passes: list[dict], column: str, span, ms: np.ndarray) -> np.ndarray | None:
    """The heat factor of every pass of a re-timed column along its own timeline: back to back
    within windows of WINDOW passes ("sweep, N back to back": one window of N), the column's wall
    span less its passes' time spread evenly over the rests between windows. None for a column
    without a span, shuffled (its order is not the file's) or launched otherwise ("as served",
    "sweep, scattered")."""
    if span is None or not column.startswith("sweep, ") or column == "sweep, shuffled":
        return None
    window = int(column.split()[1]) if column.endswith("back to back") else WINDOW
    rests = max(1, -(-len(passes) // window) - 1)
    gap = max(0.0, (span[1] - span[0]) - ms.sum() / 1e3) / rests if window < len(passes) else 0.0
    records, t = [], 0.0
    for i, (q, dur) in enumerate(zip(passes, ms / 1e3)):
        if i and i % window == 0:
            t += gap
        records.append(PassRecord.make("replay", "continuous", i, q["new_tokens"], q["context_lens"], t, dur))
        t += dur
    return np.array(factors(records, getattr(cost, "heat", None) or Heat()))


if __name__ == "__main__":
    sys.exit(main())
