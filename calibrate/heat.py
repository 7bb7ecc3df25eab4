"""Fitting how much recent prompt work slows the next passes (`sim.heat`), from a sweep's own
pass stream: the sweep runs its shapes in a shuffled order, so its passes follow prompts of every
size at every distance.

The cost model is fitted on "rested" times (each measured time divided by its pass's factor)
and the factors on the passes' measured / predicted ratios, in turn, twice: for each leak time
`tau_s` of a grid, least squares gives, for decode passes and for passes that carry prompt
tokens each, a scale `c` and the `kappa` of ratio = c * (1 + kappa * H / tau_s); the tau with
the smallest residual over both wins (c, the rested level the model has yet to absorb, is
absorbed by the next round's refit).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from core.records import PassRecord
from sim.heat import Heat, factors, heats, levels

TAU_GRID_S = (0.005, 0.01, 0.02, 0.03, 0.05, 0.08, 0.12, 0.2)


def fit_heat(passes: list[PassRecord], predicted) -> tuple[Heat, dict]:
    """(Heat, {"decode": c, "prefill": c}) from the passes' measured / predicted ratios (see the module)."""
    predicted = np.asarray(predicted, float)
    prefill = np.array([heats(p.new_tokens) for p in passes])
    ratio = np.array([p.duration_s for p in passes]) / predicted
    best = None
    for tau in TAU_GRID_S:
        h = np.asarray(levels(passes, tau))
        kappas, scales, residual = {}, {}, 0.0
        for name, sel in (("decode", ~prefill), ("prefill", prefill)):
            if not sel.any():
                kappas[name], scales[name] = 0.0, 1.0
                continue
            x = np.c_[np.ones(sel.sum()), h[sel]]
            (c, ck), *_ = np.linalg.lstsq(x, ratio[sel], rcond=None)
            kappas[name], scales[name] = float(np.clip(ck / c, 0.0, 1.0)), float(c)
            residual += float(np.sum(np.abs(ratio[sel] - c * (1 + kappas[name] * h[sel])) / ratio[sel]))
        if best is None or residual < best[0]:
            best = (residual, Heat(decode=kappas["decode"], prefill=kappas["prefill"], tau_s=tau), scales)
    return best[1], best[2]


def rested(passes: list[PassRecord], heat: Heat) -> list[PassRecord]:
    """The passes with each one's time divided by its factor."""
    if heat.zero:
        return passes
    return [dataclasses.replace(p, duration_s=p.duration_s / f) for p, f in zip(passes, factors(passes, heat))]


def fit_with_heat(passes: list[PassRecord], fit, predict_all, rounds: int = 2) -> tuple[dict, Heat]:
    """The cost model's parameters fitted on rested times, and the heat fitted against them:
    `fit(passes) -> params`, `predict_all(params, passes) -> seconds`."""
    heat = Heat()
    for _ in range(rounds):
        params = fit(rested(passes, heat))
        heat, _ = fit_heat(passes, predict_all(params, passes))
    return fit(rested(passes, heat)), heat
