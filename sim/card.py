"""A card's offset: how much longer (or shorter) one GPU takes over the passes the calibration
prices than the card the calibration was measured on. H200s of one model differ so (the
committed runs' passes are priced from 2% short to 1% long, card by card), and at the knee of a
load that moves the tail latencies by 10-20%. A served run's pass log measures it: its passes'
measured time over their price (`run_offset`). `card_offsets` gives each run the mean offset of
the *other* runs on its card at a like load, so that a run is never simulated with a figure taken
from itself.

A run's card is the GPU UUID its row names (`gpu_uuid`, recorded by the engine since it was
added). Rows recorded before name none; for them the card is a run of measurements: runs at one
git commit started within `SAME_CARD_GAP_S` of the one before (one machine kept one card for such a
run; runs at another commit may have had the same card, and are taken as another one).
"""
from __future__ import annotations

import datetime as _dt
import statistics

from core.runstore import RunStore
from sim.heat import logged_times

SAME_CARD_GAP_S = 15 * 60  # runs measured on one machine in one go start within a few minutes of each other
LOAD_RATIO = 2.0  # runs at arrival rates within this factor of each other serve a like load


def run_offset(cost, passes) -> float:
    """The passes' measured time over the time `cost` prices them at, heat included (1.01: the
    card took 1% longer than the calibration says)."""
    priced = sum(logged_times(cost, passes))
    if not priced > 0:
        raise ValueError("no passes to measure a card's offset on")
    return sum(p.duration_s for p in passes) / priced


def cards(rows: list[dict]) -> list[str]:
    """The card of each row: its `gpu_uuid` where recorded, else its run of measurements (same
    `git_commit`, started within SAME_CARD_GAP_S of the run before it at that commit)."""
    out = [r.get("gpu_uuid") or "" for r in rows]
    unnamed = sorted((i for i, r in enumerate(rows) if not out[i]),
                     key=lambda i: (rows[i]["git_commit"], started(rows[i])))
    group, last = None, None
    for i in unnamed:
        commit, t = rows[i]["git_commit"], started(rows[i])
        if last is None or commit != last[0] or (t - last[1]).total_seconds() > SAME_CARD_GAP_S:
            group = f"commit {commit} from {rows[i]['time']}"
        out[i], last = group, (commit, t)
    return out


def started(row: dict) -> _dt.datetime:
    return _dt.datetime.fromisoformat(row["time"])


def like_load(a: dict, b: dict) -> bool:
    """Whether two runs served a like load: the same workload on as many replicas, at arrival rates
    (or a trace's rate scales) within LOAD_RATIO of each other. The model's error moves with the
    load (one card's part0-workload runs: priced 1.1-2.1% long at 3-30 req/s, -0.1 to +0.9% at 60), so a
    card's offset for a run is taken at that run's load."""
    def load(row: dict) -> float:
        return row.get("rate") or row.get("rate_scale") or 1.0
    return (a.get("workload") == b.get("workload") and (a.get("replicas") or 1) == (b.get("replicas") or 1)
            and 1 / LOAD_RATIO <= load(a) / load(b) <= LOAD_RATIO)


def card_offsets(runs: list[tuple[dict, RunStore]], cost_of, first: int | None = None) -> dict[int, tuple[float, int]]:
    """For each of the `first` runs of `runs` (its row and the store holding its passes; default
    all) on a card with other runs of a like load among them (`like_load`): (the mean `run_offset`
    of those others, how many they are), by index into `runs`; `cost_of(model)` is the cost model
    a row's model is priced with. Only the pass logs of runs that give an offset are read."""
    rows = [row for row, _ in runs]
    card = cards(rows)
    offset: dict[int, float] = {}

    def offset_of(j: int) -> float:
        if j not in offset:
            row, store = runs[j]
            offset[j] = run_offset(cost_of(row["model"]), store.passes(row["run_id"]))
        return offset[j]

    out = {}
    for i in range(len(runs) if first is None else first):
        others = [j for j in range(len(runs)) if j != i and card[j] == card[i] and like_load(rows[i], rows[j])]
        if others:
            out[i] = (statistics.fmean(offset_of(j) for j in others), len(others))
    return out
