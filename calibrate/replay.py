"""Replaying real runs' pass logs through a fitted cost model.

Every pass an open or closed run of the continuous engine logged is priced by the model and set
against its measured duration (the shapes are the real ones, so this tests the cost model
alone, not the scheduler). For closed runs, TTFT and ITL are rebuilt from the predicted
durations with the run's own gaps between passes kept, and set against the measured ones; the
first pass starts when the simulator's host term says (`cost.host`: the engine planned it at 0
on an idle GPU) where the cost model carries one, at its logged start otherwise.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from core.runstore import RunStore
from sim.heat import logged_times


def engine_runs(results: Path, gpu: str, model: str):
    """(store, row) of every good run under results/continuous and results/continuous-closed
    measured on `gpu` with `model` (runs from another card or model are left out: a cost model
    fitted on one is not theirs)."""
    for engine in ("continuous", "continuous-closed"):
        store = RunStore(results / engine)
        if not store.rows_path.exists():
            continue
        for row in store.rows():
            if row.get("status") == "ok" and row.get("gpu") == gpu and row.get("model") == model:
                yield store, row


def replay_runs(results: Path, cost, gpu: str, model: str) -> list[dict]:
    """One summary per run of `engine_runs`."""
    out = []
    for store, row in engine_runs(results, gpu, model):
        try:
            passes = store.passes(row["run_id"])
        except FileNotFoundError as e:
            warnings.warn(str(e))
            continue
        out.append(replay(row, passes, cost, closed=store.root.name == "continuous-closed"))
    return out


def replay(row: dict, passes: list, cost, closed: bool) -> dict:
    measured = np.array([p.duration_s for p in passes])
    if hasattr(cost, "extrapolated"):  # (count this run's passes beyond the sweep's shapes alone)
        cost.extrapolated.clear()
    predicted = np.array(logged_times(cost, passes))
    result = {"run_id": row["run_id"], "passes": len(passes), "pass_mape": float(np.mean(np.abs(predicted / measured - 1))),
              "busy_error": float(predicted.sum() / measured.sum() - 1)}
    for kind in ("decode", "prefill", "mixed"):
        sel = np.array([p.kind == kind for p in passes])
        if sel.any():
            result[f"{kind}_mape"] = float(np.mean(np.abs(predicted[sel] / measured[sel] - 1)))
    if closed:  # token times = pass ends: rebuild them from predicted durations, gaps kept
        starts = np.array([p.start_s for p in passes])
        gaps = np.diff(starts) - measured[:-1]
        host = getattr(cost, "host", None)
        first = starts[0] if host is None or host.zero else host.idle_delay(passes[0], woke=False)
        ends_pred = first + np.cumsum(predicted + np.append(gaps, 0.0))
        ends_meas = starts + measured
        result["ttft_error"] = float(ends_pred[0] / ends_meas[0] - 1)
        itl_pred = np.diff(ends_pred).mean() if len(passes) > 1 else np.nan
        itl_meas = np.diff(ends_meas).mean() if len(passes) > 1 else np.nan
        result["itl_error"] = float(itl_pred / itl_meas - 1)
        result.update({k: row.get(k) for k in ("prompt", "batch_size")})
    if getattr(cost, "extrapolated", None):
        result["extrapolated"] = {k: n for k, (n, _) in cost.extrapolated.items()}
    return result
