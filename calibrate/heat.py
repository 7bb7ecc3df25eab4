"""Fitting how much recent prompt work slows the next passes (`sim.heat`): on a heat run when
there is one (`python -m calibrate heat`: designed sequences after rests, `fit_response`), else
on a sweep's own pass stream (its shapes in a shuffled order, so its passes follow prompts of
every size at every distance, `fit_heat`).

On a heat run, each pass's rested time is measured (its shape after a rest, in its sequence) and
the level's rise and fall times and each kind's kappa are fitted on time / rested time; the
cost model is then fitted on the sweep's times divided by their factors. On a sweep alone, the
cost model is fitted on "rested" times (each measured time divided by its pass's factor) and
the factors on the passes' measured / predicted ratios, in turn, twice: for each time constant
`tau_s` of a grid (rise and fall alike), least squares gives, for decode passes and for passes
of prompt tokens only each, a scale `c` and the `kappa` of ratio = c * (1 + kappa * h), h the
mean level over the pass (`sim.heat.levels`); the tau with the smallest residual over both wins
(c, the rested level the model has yet to absorb, is absorbed by the next round's refit).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from core.records import PassRecord
from sim.heat import Heat, factors, heats, levels

TAU_GRID_S = (0.005, 0.01, 0.02, 0.03, 0.05, 0.08, 0.12, 0.2)


def kappas_at(h: np.ndarray, ratio: np.ndarray, prefill: np.ndarray) -> tuple[dict, dict, float, dict]:
    """For levels `h` (the mean over each pass), least squares of ratio = c * (1 + kappa * h) for
    decode passes and for prompt passes each: ({kind: kappa}, {kind: c}, the sum of relative
    errors, {kind: their mean})."""
    kappas, scales, errors, residual = {}, {}, {}, 0.0
    for name, sel in (("decode", ~prefill), ("prefill", prefill)):
        if not sel.any():
            kappas[name], scales[name], errors[name] = 0.0, 1.0, 0.0
            continue
        x = np.c_[np.ones(sel.sum()), h[sel]]
        (c, ck), *_ = np.linalg.lstsq(x, ratio[sel], rcond=None)
        kappas[name], scales[name] = float(np.clip(ck / c, 0.0, 1.0)), float(c)
        miss = np.abs(ratio[sel] - c * (1 + kappas[name] * h[sel])) / ratio[sel]
        residual += float(miss.sum())
        errors[name] = float(miss.mean())
    return kappas, scales, residual, errors


def fit_heat(passes: list[PassRecord], predicted) -> tuple[Heat, dict]:
    """(Heat, {"decode": c, "prefill": c}) from the passes' measured / predicted ratios (see the module)."""
    prefill = np.array([heats(p.new_tokens) for p in passes])
    ratio = np.array([p.duration_s for p in passes]) / np.asarray(predicted, float)
    best = None
    for tau in TAU_GRID_S:
        kappas, scales, residual, _ = kappas_at(np.asarray(levels(passes, tau)), ratio, prefill)
        if best is None or residual < best[0]:
            best = (residual, Heat(decode=kappas["decode"], prefill=kappas["prefill"], tau_s=tau), scales)
    return best[1], best[2]


def rested(passes: list[PassRecord], heat: Heat) -> list[PassRecord]:
    """The passes with each one's time divided by its factor."""
    if heat.zero:
        return passes
    return [dataclasses.replace(p, duration_s=p.duration_s / f) for p, f in zip(passes, factors(passes, heat))]


def fit_with_heat(passes: list[PassRecord], fit, predict_all, rounds: int = 2,
                  heat: Heat | None = None) -> tuple[dict, Heat]:
    """The cost model's parameters fitted on rested times, and the heat fitted against them:
    `fit(passes) -> params`, `predict_all(params, passes) -> seconds`. With `heat` given (fitted
    on a heat run, `fit_response`), the parameters are fitted on the times it rests."""
    if heat is not None:
        return fit(rested(passes, heat)), heat
    heat = Heat()
    for _ in range(rounds):
        params = fit(rested(passes, heat))
        heat, _ = fit_heat(passes, predict_all(params, passes))
    return fit(rested(passes, heat)), heat


TAU_RESPONSE_GRID_S = (0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15)
QUIET_S = 0.15  # a pass this long after the last prompt pass ended counts as rested


def quiet(passes: list[PassRecord], marks: list[dict], quiet_s: float = QUIET_S) -> list[int]:
    """The passes of a heat run that start rested: before their sequence's first prompt pass ends
    (after a rest) or `quiet_s` or more after the last prompt pass ended (`marks`: the first and
    last pass index of each sequence)."""
    out = []
    for m in marks:
        last_prompt_end = None
        for i in range(m["first"], m["last"] + 1):
            p = passes[i]
            if last_prompt_end is None or p.start_s - last_prompt_end >= quiet_s:
                out.append(i)
            if heats(p.new_tokens):
                last_prompt_end = p.start_s + p.duration_s
    return out


def rested_references(passes: list[PassRecord], marks: list[dict], quiet_s: float = QUIET_S) -> np.ndarray:
    """Each pass's rested time, from a heat run (`python -m calibrate heat`): the median, within
    its sequence, of its shape's `quiet` passes; a shape with none in a sequence takes the median
    of those over all sequences. Per sequence, because a GPU's speed can step by several percent
    between sequences for reasons of its own."""
    def shape(p):
        return tuple(p.new_tokens), tuple(p.context_lens)
    sequence_of = {i: m["first"] for m in marks for i in range(m["first"], m["last"] + 1)}
    per_seq: dict = {}
    overall: dict = {}
    for i in quiet(passes, marks, quiet_s):
        per_seq.setdefault((sequence_of[i], shape(passes[i])), []).append(passes[i].duration_s)
        overall.setdefault(shape(passes[i]), []).append(passes[i].duration_s)
    refs = np.zeros(len(passes))
    for i, first in sequence_of.items():
        key = shape(passes[i])
        times = per_seq.get((first, key)) or overall.get(key)
        if not times:
            raise ValueError(f"heat run: no rested pass of shape {passes[i].kind} "
                             f"({len(key[0])} sequences, {sum(key[0])} new tokens)")
        refs[i] = float(np.median(times))
    return refs


def rested_scatter(passes: list[PassRecord], marks: list[dict]) -> float:
    """How much a rested pass's time scatters around its shape's (`sim.noise.robust_sigma` of
    time / rested time over a heat run's quiet decode passes)."""
    from sim.noise import robust_sigma
    refs = rested_references(passes, marks)
    return robust_sigma([passes[i].duration_s / refs[i] for i in quiet(passes, marks) if not heats(passes[i].new_tokens)])


def repeat_scatter(passes: list[PassRecord]) -> float:
    """The same from a sweep: each timed pass against the median of its shape's repeats."""
    from sim.noise import robust_sigma
    by_shape: dict = {}
    for p in passes:
        by_shape.setdefault((tuple(p.new_tokens), tuple(p.context_lens)), []).append(p.duration_s)
    return robust_sigma([d / float(np.median(times)) for times in by_shape.values() if len(times) > 1 for d in times])


def fit_response(passes: list[PassRecord], marks: list[dict]) -> tuple[Heat, dict]:
    """The heat model fitted on a heat run: each pass's time over its rested time (as
    `rested_references`) against the mean of h over it, for every pair of rise and fall times of
    a grid (`kappas_at`; the scale c takes up what the references miss: a prompt pass from rest
    heats the card during itself already); the pair with the smallest sum of relative errors
    wins. Returns (Heat, {kind: mean relative error})."""
    if not marks:
        raise ValueError("heat run: no sequences recorded")
    ratio = np.array([p.duration_s for p in passes]) / rested_references(passes, marks)
    prefill = np.array([heats(p.new_tokens) for p in passes])
    best = None
    for up in TAU_RESPONSE_GRID_S:
        for down in TAU_RESPONSE_GRID_S:
            kappas, _, residual, errors = kappas_at(np.asarray(levels(passes, down, up)), ratio, prefill)
            if best is None or residual < best[0]:
                best = (residual, Heat(decode=kappas["decode"], prefill=kappas["prefill"], tau_s=down, tau_up_s=up),
                        errors)
    return best[1], best[2]
