"""TTFT by stage, real against simulated: intake (arrival to taken in by the replica's scheduler),
queue (to the first pass's start) and prefill (to the first token), for every engine run whose
request records time them (the continuous engine's since dc6c4c4).

    python benchmarks/ttft_stages.py [RUNS_DIR ...] [--seeds N] [--cost calibrated:h200]

RUNS_DIR is a directory of runs (runs.jsonl beside one directory per run; default
results/continuous and results/continuous-repeats). Each run is simulated as `python -m sim compare`
simulates it (its own arrivals, lengths, policy, limits, replicas and router), once without
scatter and with seeds 0..N-1 with it; each line gives median, mean and p90 in ms. Made to answer
whether two replicas see arrivals later than one (the router's hand-over): compare the intake
lines of a two-replica run with its simulation and with one replica at its rate a replica.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.metrics import STAGES, compute_metrics  # noqa: E402
from core.runstore import RunStore  # noqa: E402
from sim.compare import cost_loader, simulate_like  # noqa: E402

DEFAULT_DIRS = [ROOT / "results" / "continuous", ROOT / "results" / "continuous-repeats"]


def line(label: str, m) -> str:
    parts = [f"TTFT {m.ttft.median * 1e3:6.2f} {m.ttft.mean * 1e3:6.2f} {m.ttft.percentiles[90.0] * 1e3:6.2f}"]
    parts += [f"{name} {getattr(m, name).median * 1e3:6.2f} {getattr(m, name).mean * 1e3:6.2f} "
              f"{getattr(m, name).percentiles[90.0] * 1e3:6.2f}" for name in STAGES]
    return f"  {label:<9}" + " | ".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="*", type=Path, default=DEFAULT_DIRS, help="directories of runs")
    p.add_argument("--seeds", type=int, default=2, help="scattered simulations a run, besides the plain one")
    p.add_argument("--cost", default="calibrated:h200", help="the simulator's cost model")
    args = p.parse_args(argv)
    print("each: median, mean, p90 (ms)")
    found = 0
    cost_of = cost_loader(args.cost)
    for root in args.dirs:
        store = RunStore(root)
        if not store.rows_path.exists():
            print(f"error: {root}: no runs.jsonl", file=sys.stderr)
            return 2
        for row in store.rows():
            real = store.requests(row["run_id"])
            m = compute_metrics(real)
            if m.intake is None:  # records from before the engine timed the stages
                continue
            found += 1
            cost = cost_of(row["model"])
            print(f"{row['run_id']} ({root.name})")
            print(line("real", m))
            for seed in [None, *range(args.seeds)]:
                sim = simulate_like(row, real, cost, seed=seed)
                print(line("sim" if seed is None else f"sim {seed}", compute_metrics(sim.table)))
    if not found:
        print("no run's records time TTFT's stages", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
