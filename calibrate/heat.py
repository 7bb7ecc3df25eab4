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

On the engine's open runs (`fit_serving`, `calibrate fit --serving-heat`), the slow-downs alone
are fitted again, at the heat run's time constants and loads: serving's mixed passes slowed far
less, and its prompt passes more, than the designed sequences' at the same level.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from core.records import PassRecord
from sim.heat import Heat, factors, heats, levels

TAU_GRID_S = (0.005, 0.01, 0.02, 0.03, 0.05, 0.08, 0.12, 0.2)


def kappas_at(h: np.ndarray, u: np.ndarray, ratio: np.ndarray) -> tuple[dict, dict, float, dict]:
    """For levels `h` (the mean over each pass) and loads `u`, least squares of ratio = c + c *
    kappa(u) * h, kappa(u) = decode + (prefill - decode) * u, with one scale c for the passes of
    load under a half ("decode") and one for the others ("prefill"): ({kind: kappa}, {kind: c},
    the sum of relative errors, {kind: their mean})."""
    light = u < 0.5
    columns = [light.astype(float), (~light).astype(float), (1 - u) * h, u * h]
    x = np.c_[tuple(columns)]
    keep = [i for i in range(4) if x[:, i].any()]
    coef = np.zeros(4)
    coef[keep] = np.linalg.lstsq(x[:, keep], ratio, rcond=None)[0]
    scales = {"decode": coef[0] or 1.0, "prefill": coef[1] or 1.0}
    kappas = {"decode": float(np.clip(coef[2] / scales["decode"], 0.0, 1.0)),
              "prefill": float(np.clip(coef[3] / scales["prefill"], 0.0, 1.0))}
    c = np.where(light, scales["decode"], scales["prefill"])
    miss = np.abs(ratio - c * (1 + (kappas["decode"] * (1 - u) + kappas["prefill"] * u) * h)) / ratio
    errors = {"decode": float(miss[light].mean()) if light.any() else 0.0,
              "prefill": float(miss[~light].mean()) if (~light).any() else 0.0}
    return kappas, {k: float(v) for k, v in scales.items()}, float(miss.sum()), errors


def fit_heat(passes: list[PassRecord], predicted) -> tuple[Heat, dict]:
    """(Heat, {"decode": c, "prefill": c}) from the passes' measured / predicted ratios (see the
    module; the older rule of loads: 1 for passes of prompt tokens only, 0 for the others)."""
    ratio = np.array([p.duration_s for p in passes]) / np.asarray(predicted, float)
    u = np.array([Heat().load(p.new_tokens) for p in passes])
    best = None
    for tau in TAU_GRID_S:
        kappas, scales, residual, _ = kappas_at(np.asarray(levels(passes, Heat(tau_s=tau))), u, ratio)
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


def fit_serving(runs: list[list[PassRecord]], cost, heat: Heat) -> tuple[Heat, dict]:
    """`heat` with its slow-downs refitted on open runs' pass logs (`runs`: each run's passes): each
    pass's logged time over `cost`'s rested price against the mean of h over it (`heat`'s time
    constants and loads; each replica's GPU on its own), least squares of measured / priced - 1 =
    kappa * h, each pass weighted by its time, with decode and prefill as `Heat.kappa` has them
    and one kappa of its own for mixed passes (`Heat.mixed`). Returns (Heat, {"runs", "passes",
    and per kind of pass its price over its logged time, less 1: "before" with `heat`, "after"})."""
    rows, all_passes = [], []
    for passes in runs:
        for p, h in zip(passes, levels(passes, heat)):
            u = heat.load(p.new_tokens)
            mixed = p.kind == "mixed"  # (pass_kind's, as Heat.kappa_of takes it)
            rows.append((h * (1 - u) * (not mixed), h * u * (not mixed), h * mixed,
                         cost.pass_time(p.new_tokens, p.context_lens), p.duration_s, p.kind, h))
            all_passes.append(p)
    if not rows:
        raise ValueError("--serving-heat: no open runs' passes to fit the heat's slow-downs on")
    x = np.array([r[:3] for r in rows], float)
    rested, measured = np.array([r[3] for r in rows]), np.array([r[4] for r in rows])
    kinds = np.array([r[5] for r in rows])
    level = np.array([r[6] for r in rows])  # (the time constants and loads are the same before and after)
    missing = [k for k, col in (("decode or prompt", x[:, 0]), ("prompt", x[:, 1]), ("mixed", x[:, 2]))
               if not col.any()]
    if missing:
        raise ValueError(f"--serving-heat: the open runs have no {' or '.join(missing)} passes at any heat "
                         "to fit their slow-down on")
    w = np.sqrt(measured)
    coef = np.linalg.lstsq(x * w[:, None], (measured / rested - 1) * w, rcond=None)[0]
    decode, prefill, mixed = (float(np.clip(c, 0.0, 1.0)) for c in coef)
    fitted = dataclasses.replace(heat, decode=decode, prefill=prefill, mixed=mixed)
    basis = {"runs": len(runs), "passes": len(rows)}
    for name, shape in (("before", heat), ("after", fitted)):
        kappa = np.array([shape.kappa_of(p.new_tokens, p.context_lens) for p in all_passes])
        priced = rested * (1 + kappa * level)
        basis[name] = {k: float(priced[kinds == k].sum() / measured[kinds == k].sum() - 1)
                       for k in ("decode", "prefill", "mixed") if (kinds == k).any()}
    return fitted, basis


TAU_RESPONSE_GRID_S = (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.12)
FULL_TOKENS_GRID = (0, 1024, 2048, 4096)  # 0: the older rule (prompt passes load the card fully)
DECODE_WEIGHT_GRID = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0)  # tokens a decode beside prompt tokens counts as
QUIET_S = 0.15  # a pass this long after the last heavy pass ended counts as rested
HEAVY_TOKENS = 256  # a pass of this many prompt tokens (or of prompt tokens only) counts as heavy


def heavy(p: PassRecord) -> bool:
    return heats(p.new_tokens) or sum(n for n in p.new_tokens if n > 1) >= HEAVY_TOKENS


def quiet(passes: list[PassRecord], marks: list[dict], quiet_s: float = QUIET_S) -> list[int]:
    """The passes of a heat run that start rested: before their sequence's first `heavy` pass ends
    (after a rest) or `quiet_s` or more after the last heavy pass ended (`marks`: the first and
    last pass index of each sequence)."""
    out = []
    for m in marks:
        last_heavy_end = None
        for i in range(m["first"], m["last"] + 1):
            p = passes[i]
            if last_heavy_end is None or p.start_s - last_heavy_end >= quiet_s:
                out.append(i)
            if heavy(p):
                last_heavy_end = p.start_s + p.duration_s
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
    return robust_sigma([passes[i].duration_s / refs[i] for i in quiet(passes, marks) if not heavy(passes[i])])


def repeat_scatter(passes: list[PassRecord]) -> float:
    """The same from a sweep: each timed pass against the median of its shape's repeats."""
    from sim.noise import robust_sigma
    by_shape: dict = {}
    for p in passes:
        by_shape.setdefault((tuple(p.new_tokens), tuple(p.context_lens)), []).append(p.duration_s)
    return robust_sigma([d / float(np.median(times)) for times in by_shape.values() if len(times) > 1 for d in times])


CHECKED = ("serving", "serving chunked")  # heat-run sequences held out of the fit: the model is checked on them


def fit_response(passes: list[PassRecord], marks: list[dict], checked=CHECKED) -> tuple[Heat, dict]:
    """The heat model fitted on a heat run: each pass's time over its rested time (as
    `rested_references`) against the mean of h over it, for every rise time, fall time and
    full-load size of a grid (`kappas_at`; the scales c take up what the references miss: a heavy
    pass from rest heats the card during itself already); the one with the smallest sum of
    relative errors wins. The sequences named in `checked` (prompt and decode passes alternating
    as a saturated engine runs them) are left out of the fit and priced by it. Returns (Heat,
    {kind: mean relative error of the fit, "checked " + kind: the checked sequences' mean of
    measured / priced - 1})."""
    if not marks:
        raise ValueError("heat run: no sequences recorded")
    ratio = np.array([p.duration_s for p in passes]) / rested_references(passes, marks)
    held = np.zeros(len(passes), bool)
    for m in marks:
        if m["segment"] in checked:
            held[m["first"]:m["last"] + 1] = True
    fit = ~held

    def loads(shape: Heat) -> np.ndarray:
        return np.array([shape.load(p.new_tokens) for p in passes])

    def scan(best, weight: float):
        """The grid of rise, fall and full load at one decode weight; the best of it and `best`."""
        for full in FULL_TOKENS_GRID:
            if weight and not full:
                continue  # (the older rule has no load to dilute)
            u = loads(Heat(full_tokens=full, decode_weight=weight))  # (the loads do not depend on the times)
            for up in TAU_RESPONSE_GRID_S:
                for down in TAU_RESPONSE_GRID_S:
                    best = trial(best, Heat(tau_s=down, tau_up_s=up, full_tokens=full, decode_weight=weight), u)
        return best

    def trial(best, shape: Heat, u: np.ndarray):
        h = np.asarray(levels(passes, shape))
        kappas, scales, residual, errors = kappas_at(h[fit], u[fit], ratio[fit])
        if best is None or residual < best[0]:
            return residual, dataclasses.replace(shape, decode=kappas["decode"], prefill=kappas["prefill"]), errors, scales
        return best

    # the time constants and full load with no dilution, then how much decodes beside prompt
    # tokens dilute a pass's load (a mixed pass of 256 decodes heats less than one of 64) at
    # those, then the grid again at that weight
    best = scan(None, 0.0)
    for weight in DECODE_WEIGHT_GRID[1:]:
        shape = dataclasses.replace(best[1], decode=0.0, prefill=0.0, decode_weight=weight)
        best = trial(best, shape, loads(shape))
    if best[1].decode_weight:
        best = scan(best, best[1].decode_weight)
    heat, errors, scales = best[1], dict(best[2]), best[3]
    if held.any():  # priced as the fit prices its own passes: c * factor
        priced = np.asarray(factors(passes, heat))
        u = np.array([heat.load(p.new_tokens) for p in passes])
        for kind, sel in (("decode", held & (u < 0.5)), ("prefill", held & (u >= 0.5))):
            if sel.any():
                errors["checked " + kind] = float(np.mean(ratio[sel] / (scales[kind] * priced[sel])) - 1)
    return heat, errors
