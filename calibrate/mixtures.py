"""Decode batches of spread contexts beside their twins of one context (`python -m calibrate sweep
--grid mixtures`, rows of kind "sweep-mixtures"): their pairs, and the cost model's spread term
fitted on them (`sim.calibrated`: `spread_s` and `spread_from`).

A pair is a batch and its twin: the same number of sequences, every one at the batch's rounded
mean context. Set side by side, they tell what spreading a batch's contexts costs the GPU, apart
from the card's level (its clocks, its heat): the difference of the two times. The model, fitted
without the term, prices that difference short from about 64 sequences up; the term

    spread_s * max(0, B - spread_from) * (live(Lm) - live(Lbar))

is fitted on what it leaves (`fit_spread`: least squares on each pair's miss over the batch's
time, for every `spread_from` of FROM_GRID, `spread_s` at least 0, the `spread_from` with the least
error kept), for batches of the small slicing (padded batches under 128 on the H200). Batches
that fill the GPU keep 0: there a spread of contexts costs what the tail of a list schedule of
the kernel's programs costs (`sim.schedule`), which no term on the mean and the longest context
holds (fitted there, this one took the sweep's decode fit to another basin: in-sample 1.85%
against 1.46%). The term is optional (`calibrate fit --spread`); the shipped H200 calibration
has it at 0.
"""
from __future__ import annotations

import copy
from collections import defaultdict
from pathlib import Path

import numpy as np

from core.runstore import RunStore
from sim.calibrated import bucket

FROM_GRID = tuple(range(0, 121, 8))  # sequences (graph buckets are multiples of 8 there)
KIND = "sweep-mixtures"


def shape_medians(passes) -> dict[tuple, float]:
    """(sequences, contexts) -> the median time of that shape's timed decode passes."""
    times = defaultdict(list)
    for p in passes:
        if p.kind == "decode":
            times[(len(p.new_tokens), tuple(p.context_lens))].append(p.duration_s)
    return {k: float(np.median(v)) for k, v in times.items()}


def pairs(medians: dict[tuple, float]) -> dict[int, list[tuple]]:
    """Per batch size, (spread contexts, its time, its twin's contexts, the twin's time): a twin is
    the batch of one context equal to the spread batch's rounded mean."""
    out = defaultdict(list)
    for (S, ctx), t in medians.items():
        if len(set(ctx)) > 1:
            twin = (S, (round(sum(ctx) / S),) * S)
            if twin in medians:
                out[S].append((ctx, t, twin[1], medians[twin]))
    return out


def mixture_pairs(results: Path, gpu: str, model: str) -> tuple[list[tuple], list[str]]:
    """Every pair of the mixtures runs (rows of kind KIND, where `calibrate sweep --grid mixtures`
    writes them: RESULTS/calibration) timed on `gpu` with `model` (each run's pairs from its own
    medians), and those runs' ids; none when there are none."""
    store = RunStore(Path(results) / "calibration")
    if not store.rows_path.exists():
        return [], []
    out, runs = [], []
    for row in store.rows():
        if row.get("kind") != KIND or row.get("gpu") != gpu or row.get("model") != model:
            continue
        runs.append(row["run_id"])
        for rows in pairs(shape_medians(store.passes(row["run_id"]))).values():
            out.extend(rows)
    return out, runs


def pair_miss(mix: list[tuple], cost) -> float:
    """The RMS, over the pairs of `mix` of the small slicing, of the miss of `cost`'s price
    difference between a spread batch and its twin against their times' difference, over the
    spread batch's time."""
    return float(np.sqrt(np.mean(np.square(_misses([q for q in mix if not cost.fills(len(q[0]))], cost)[2]))))


def fit_spread(mix: list[tuple], cost) -> tuple[float, dict, float]:
    """(spread_from, {"small": spread_s, "big": 0}, the small batches' pairs' RMS miss over their
    batches' time with the term) fitted on `mix` (`mixture_pairs`) against `cost`, a CalibratedCost
    (its own spread term left out)."""
    cost = copy.deepcopy(cost)
    for rates in cost.pd_rates.values():
        rates["spread_s"] = 0.0
    B, dlive, miss, t = _misses([q for q in mix if not cost.fills(len(q[0]))], cost)
    short = -miss  # what the term is to add
    best = None
    for start in FROM_GRID:
        x = np.maximum(0.0, B - start) * dlive / t  # the term per second of spread_s, over the batch's time
        xx = float(x @ x)
        rate = max(0.0, float(x @ short) / xx) if xx > 0 else 0.0
        sse = float(np.sum((short - rate * x) ** 2))
        if best is None or sse < best[2]:
            best = (float(start), rate, sse)
    return best[0], {"small": best[1], "big": 0.0}, float(np.sqrt(best[2] / len(short)))


def _misses(mix: list[tuple], cost) -> tuple:
    """Per pair: the padded batch, the longest's live slices beyond the mean's, the miss of
    `cost`'s price difference against the times' over the spread batch's time, and that time."""
    if not mix:
        raise ValueError("no pairs of a spread batch and its twin of the small slicing to fit the spread term on")
    price = lambda ctx: cost.pass_time([1] * len(ctx), list(ctx))  # noqa: E731
    rows = []
    for ctx, t, twin, tt in mix:
        S = len(ctx)
        rows.append((bucket(S, cost.buckets), cost.spread_slices(S, sum(ctx), max(ctx)),
                     ((price(ctx) - price(twin)) - (t - tt)) / t, t))
    return tuple(np.array(c, dtype=float) for c in zip(*rows))
