"""A grid of runs (rates x policies x caps x replicas x seeds) in parallel processes.

Every grid point runs once per replication (seeds seed, seed+1, ...); each run is one row of
metrics, and points with several replications get a mean and confidence interval per metric.
"""
from __future__ import annotations

import itertools
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Iterable, Sequence

from tqdm import tqdm

from sim.build import RunSpec, simulate_spec
from sim.metrics import compute_metrics, confidence_interval

AXES = ("rate", "rate_scale", "policy", "max_num_seqs", "replicas")


def grid(base: RunSpec, replications: int = 1, **axes: Sequence) -> list[RunSpec]:
    """One spec per combination of the axes' values (unnamed axes keep `base`'s value) and
    replication, the replication's seed being base.seed + its index."""
    names = [name for name, values in axes.items() if values]
    specs = []
    for values in itertools.product(*(axes[n] for n in names)):
        point = base.with_(**dict(zip(names, values)))
        specs.extend(point.with_(seed=base.seed + i) for i in range(replications))
    return specs


def run_point(spec: RunSpec, slos: dict[str, float] | None = None) -> dict:
    """One run's row: the axes' values, the seed, the metrics (vLLM names) and the run's cost."""
    result = simulate_spec(spec)
    row = {name: getattr(spec, name) for name in AXES}
    row["seed"] = spec.seed
    row.update(compute_metrics(result.requests, slos).as_row())
    row["passes"] = result.num_passes
    row["wall_s"] = result.wall_s
    return row


def sweep(specs: list[RunSpec], slos: dict[str, float] | None = None, jobs: int | None = None,
          progress: bool = True) -> list[dict]:
    """Run every spec, `jobs` at a time in worker processes (1: in this process)."""
    jobs = jobs or os.cpu_count() or 1
    bar = tqdm(total=len(specs), desc="sweep", unit="run", disable=not progress)
    rows: list[dict] = []
    if jobs == 1:
        for spec in specs:
            rows.append(run_point(spec, slos))
            bar.update()
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(run_point, spec, slos) for spec in specs]
            for future in as_completed(futures):
                rows.append(future.result())
                bar.update()
    bar.close()
    return sorted(rows, key=lambda r: tuple((r[k] is None, r[k] or 0) for k in (*AXES, "seed")))


def summarize(rows: list[dict], metrics: Iterable[str], level: float = 0.95) -> list[dict]:
    """One row per grid point: each metric's mean and confidence-interval half-width (`_ci`)."""
    points: dict[tuple, list[dict]] = {}
    for row in rows:
        points.setdefault(tuple(row[k] for k in AXES), []).append(row)
    out = []
    for key, reps in points.items():
        summary = dict(zip(AXES, key))
        summary["replications"] = len(reps)
        for m in metrics:
            mean, half = confidence_interval([r[m] for r in reps if r[m] is not None], level)
            summary[m] = mean
            summary[f"{m}_ci"] = half
        out.append(summary)
    return out
