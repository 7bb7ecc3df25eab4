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

ENGINE_FOLDERS = ("continuous", "continuous-closed")  # the engine's runs a calibration reads, under RESULTS


def engine_runs(results: Path, gpu: str, model: str, only: dict | None = None):
    """(store, row) of every good run under results/continuous and results/continuous-closed
    measured on `gpu` with `model` (runs from another card or model are left out: a cost model
    fitted on one is not theirs); with `only` ({folder: run ids}, a calibration's `runs_read`), just
    those, every one of them there (else an error naming the missing)."""
    missing = []
    for engine in ENGINE_FOLDERS:
        store = RunStore(results / engine)
        wanted = None if only is None else set(only.get(engine, ()))
        if store.rows_path.exists():
            for row in store.rows():
                if wanted is not None and row["run_id"] not in wanted:
                    continue
                if row.get("status") == "ok" and row.get("gpu") == gpu and row.get("model") == model:
                    if wanted is not None:
                        wanted.discard(row["run_id"])
                    yield store, row
        missing += [f"{engine}/{r}" for r in sorted(wanted or ())]
    if missing:
        raise ValueError(f"{len(missing)} of the runs asked for are not under {results} as good runs of {model} on "
                         f"{gpu}: " + ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else ""))


def runs_read(results: Path, gpu: str, model: str, only: dict | None = None) -> dict:
    """{folder: sorted run ids} of `engine_runs`: what a calibration's host time, serving heat and
    replays read (kept in its file as `runs_read`, so that `calibrate fit --runs-of` reads them again)."""
    out = {engine: [] for engine in ENGINE_FOLDERS}
    for store, row in engine_runs(results, gpu, model, only):
        out[store.root.name].append(row["run_id"])
    return {k: sorted(v) for k, v in out.items()}


def replay_runs(results: Path, cost, gpu: str, model: str, only: dict | None = None) -> list[dict]:
    """One summary per run of `engine_runs`."""
    out = []
    for store, row in engine_runs(results, gpu, model, only):
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
