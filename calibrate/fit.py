"""Fitting the engine's cost model (`sim.calibrated.CalibratedCost`) to timed passes.

The form is the hardware's and the engine's (the module `sim.calibrated` says it term by term):
a pass reads the weights or is bound by the projections' arithmetic, runs its attention
kernels' programs in waves over the GPU's SMs (each wave as long as its longest program or its
reads), and pays fixed costs; decode graphs' own times are a measured table per padded batch.
Fitted with scipy on relative error (every pass counts by its relative miss, so short passes
matter as much as long ones), with a soft_l1 loss so that a repeat far off its shape's others
pulls less than its square, regime by regime (decode1, decode and prefill share no parameter).
Decode attention's spread term, which the sweep's few batches of spread contexts cannot pin (fitted
with the rest, it took the decode regime to another basin), is fitted apart on decode batches of
spread contexts beside their twins (`calibrate.mixtures`, `calibrate fit --spread`) and held here.

Error is measured on shapes the fit did not see (whole groups of shapes held out, never random
rows): batch sizes between the graph buckets and one context length for decode, some chunk
sizes and contexts for prefill, one chunk size for mixed passes.
"""
from __future__ import annotations

import copy
import math
import zlib
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from core.config import ModelConfig
from core.records import PassRecord
from sim.calibrated import (DECODE1, DECODE_ATTENTION, FORMAT, MIXED, PREFILL, SCHEDULE, UNITS, CalibratedCost, bucket,
                            regime, smoothed)
from sim.cost import RooflineCost

PRIOR = {"fixed_s": 1e-3, "kv_gbs": 2500.0, "serial_s_per_token": 1e-6, "weight_gbs": 2000.0, "matmul_tflops": 700.0,
         "block_s": 2e-5, "merge_s": 5e-6, "program_s": 1e-8, "per_seq_s": 2e-6, "graph_s": 2e-3,
         "eager_s": 1e-3, "shared": 0.9, "tail": 0.75, "smooth": 4.0}
# The waves a kernel's programs run in: the GPU's SMs (a sweep row's "sms" wins; else this table,
# from the vendors' specs) times the programs of a kernel resident on one SM at once (decode
# attention: 4, its registers and shared memory allow; chunk attention's 128-row tiles: 1).
SMS = {"NVIDIA H200": 132, "NVIDIA H100 80GB HBM3": 132, "NVIDIA A100-SXM4-80GB": 108, "NVIDIA A10G": 80,
       "NVIDIA A10": 72, "NVIDIA L4": 58}
DECODE_PROGRAMS_PER_SM = 4
PREFILL_PROGRAMS_PER_SM = 1
ROBUST_SCALE = 0.05  # soft_l1's scale: a pass more than ~5% off its prediction counts less than its square
MIN_PASSES = {"decode1": 6, "decode": 12, "prefill": 12}
PREFILL_PRIOR = {"block_s": 5e-5, "program_s": 1e-4}  # chunk attention: a block and a tile's fixed cost, every layer


def constants(model: ModelConfig, dtype_bytes: int = 2) -> dict:
    """The model's shape, in the units the cost model multiplies by."""
    return {"weight_bytes": model.weight_bytes_read_per_pass(dtype_bytes),
            "flops_per_token": model.flops_per_token(0),
            "kv_bytes_per_token": model.kv_bytes_per_token(dtype_bytes)}


def sweep_range(passes: list[PassRecord]) -> dict:
    """The largest shapes the sweep timed: tokens in one pass, sequences in one decode pass,
    positions of one sequence (context and new tokens). The simulator counts the passes it prices
    beyond them (`sim.calibrated.CalibratedCost.extrapolated`)."""
    return {"pass_tokens": max(sum(p.new_tokens) for p in passes),
            "decode_batch": max((len(p.new_tokens) for p in passes if p.kind == "decode"), default=0),
            "context": max(c + n for p in passes for c, n in zip(p.context_lens, p.new_tokens))}


def group_of(p: PassRecord) -> str:
    """The shape group a pass belongs to (the held-out split is by group)."""
    n, c = p.new_tokens, p.context_lens
    if p.kind == "decode":
        return f"decode b{len(n)} " + (f"c{c[0]}" if len(set(c)) == 1 else "mixed contexts")
    if p.kind == "mixed":
        return f"mixed n{max(n)} b{len(n) - 1}"
    if len(n) == 1:
        return f"prefill n{n[0]} c{c[0]}"
    return f"prompts {len(n)}x{max(n)}"


def held_out(group: str, buckets: list[int]) -> bool:
    """Decode: batch sizes between the graph buckets, and contexts of 1500 (2048 in sweeps before
    the contexts moved off the slicing steps); prefill: chunks of
    1024 or 8192 tokens and contexts of 1024; mixed: chunks near 1024 tokens; prompt groups by a
    fixed hash."""
    words = group.split()
    if words[0] == "decode":
        return int(words[1][1:]) not in buckets or words[2] in ("c1500", "c2048")
    if words[0] == "prefill":
        return words[1] in ("n1024", "n8192") or words[2] == "c1024"
    if words[0] == "mixed":
        return 900 <= int(words[1][1:]) <= 1100
    return zlib.crc32(group.encode()) % 3 == 0


def waves_of(row: dict) -> dict:
    """The waves' shape for a sweep's GPU: its SMs (the row's, else SMS's) and the programs
    resident on one (the row's, else the constants above)."""
    sms = row.get("sms") or SMS.get(row.get("gpu", ""))
    if not sms:
        raise ValueError(f"the number of SMs of {row.get('gpu')!r} is unknown: add it to calibrate.fit.SMS "
                         "or record \"sms\" in the sweep's row")
    return {"sms": sms, "decode_programs_per_sm": row.get("decode_programs_per_sm") or DECODE_PROGRAMS_PER_SM,
            "prefill_programs_per_sm": row.get("prefill_programs_per_sm") or PREFILL_PROGRAMS_PER_SM}


def skeleton(meta: dict, c: dict, buckets: list[int], token_buckets: list[int], attention: dict, chunk: dict,
             waves: dict) -> dict:
    """A calibration file without parameters (what the model needs to know of the engine and the GPU)."""
    return {"format": FORMAT, **meta, "graph_buckets": buckets, "token_buckets": token_buckets, "constants": c,
            "decode_attention": attention, "chunk_attention": chunk, "waves": waves, "units": UNITS}


DECODE_SHAPE = ("programs", "blocks", "crit", "merges")
# decode attention's rates the least squares fits; `spread_s` is fitted apart, on the mixtures'
# pairs (`calibrate.mixtures`), and given to `fit_params`
FITTED_ATTENTION = tuple(k for k in DECODE_ATTENTION if k != "spread_s")
NO_SPREAD = (0.0, {"small": 0.0, "big": 0.0})


@dataclass
class Design:
    """Per pass, what the model's parameters multiply (vectorised): for decode the arguments of
    `CalibratedCost.decode_attention` (DECODE_SHAPE), for prefill those of `chunk_attention`
    (kv, programs, blocks: all programs' blocks, crit, waves); decode1's crit is its slice's
    positions, merges its live slices; `graph` each decode pass's index into `buckets`, the
    decode buckets fitted; `padded` its padded batch and `dlive` the longest's live slices beyond
    the mean's (the spread term's)."""

    regime: np.ndarray   # 0 decode1, 1 decode, 2 prefill
    big: np.ndarray      # decode: the padded batch fills the GPU (the second slicing)
    graph: np.ndarray
    m: np.ndarray        # prefill: tokens padded to the graph's
    eager: np.ndarray    # prefill: past the largest token bucket (no graph)
    kv: np.ndarray       # KV positions read
    crit: np.ndarray
    programs: np.ndarray
    blocks: np.ndarray
    merges: np.ndarray
    padded: np.ndarray
    dlive: np.ndarray
    waves: np.ndarray
    seqs: np.ndarray
    seconds: np.ndarray
    buckets: list[int]

    def rows(self, sel: np.ndarray) -> "Design":
        """The passes `sel` picks."""
        return Design(**{k: getattr(self, k)[sel] for k in self.__dataclass_fields__ if k != "buckets"},
                      buckets=self.buckets)

    @classmethod
    def of(cls, passes: list[PassRecord], model: CalibratedCost) -> "Design":
        names = [f for f in cls.__dataclass_fields__ if f != "buckets"]
        cols = {k: [] for k in names}
        fitted = sorted({bucket(len(p.new_tokens), model.buckets) for p in passes if regime(p.new_tokens) == "decode"})
        for p in passes:
            r, S = regime(p.new_tokens), len(p.new_tokens)
            n, ctx = p.new_tokens, p.context_lens
            row = dict.fromkeys(names, 0)
            row.update(regime=("decode1", "decode", "prefill").index(r), graph=-1, seqs=S, seconds=p.duration_s,
                       kv=sum(ctx) + sum(n))
            if r == "decode1":
                _, _, live, blk = model.slice_of(ctx[0] + 1, 1)
                row.update(crit=blk * model.block_n, merges=live)
            elif r == "decode":
                B, big, *shape = model.decode_shape(S, sum(ctx), max(ctx))
                row.update(big=big, graph=fitted.index(B), **dict(zip(DECODE_SHAPE, shape)), padded=B,
                           dlive=model.spread_slices(S, sum(ctx), max(ctx)))
            else:
                P, work, crit, waves = model.chunk_waves(n, ctx)
                m = bucket(sum(n), model.token_buckets)
                row.update(m=m, eager=model.eager(m), programs=P, blocks=work, crit=crit, waves=waves)
            for k in names:
                cols[k].append(row[k])
        return cls(**{k: np.asarray(v, dtype=None if k in ("regime", "big", "graph", "eager") else float)
                      for k, v in cols.items()}, buckets=fitted)


def unpack(theta: np.ndarray, buckets: list[int], spread: tuple = NO_SPREAD) -> dict:
    """Parameter vector (logs) -> the file's parameters; `spread`: (spread_from, {"small":
    spread_s, "big": spread_s}), fitted apart."""
    v = iter(np.exp(theta).tolist())
    start, rates = spread
    p = {"decode1": {k: next(v) for k in DECODE1},
         "decode": {"small": {**{k: next(v) for k in FITTED_ATTENTION}, "spread_s": rates["small"]},
                    "big": {**{k: next(v) for k in FITTED_ATTENTION}, "spread_s": rates["big"]}},
         "prefill": {k: next(v) for k in PREFILL}}
    p["decode"]["graph_s"] = {str(b): next(v) for b in buckets}
    p["decode"]["spread_from"] = start
    return p


def layout(buckets: list[int]) -> list[tuple[int, str]]:
    """(regime, name) of each entry of the parameter vector, in `unpack`'s order (0 decode1, 1
    decode, 2 prefill: no parameter is shared between regimes)."""
    return ([(0, k) for k in DECODE1] + [(1, k) for k in FITTED_ATTENTION] * 2
            + [(2, k) for k in PREFILL] + [(1, "graph_s")] * len(buckets))


def initial(buckets: list[int]) -> np.ndarray:
    return np.log([PREFILL_PRIOR.get(n, PRIOR[n]) if r == 2 else PRIOR[n] for r, n in layout(buckets)])


def predict(params: dict, c: dict, f: Design, model: CalibratedCost) -> np.ndarray:
    """The model's pass times for the passes of `f` (the formulas of sim.calibrated, vectorised)."""
    out = np.zeros(len(f.seconds))
    kvb = c["kv_bytes_per_token"]
    p1, pd, pp = params["decode1"], params["decode"], params["prefill"]
    sel = f.regime == 0
    out[sel] = p1["fixed_s"] + f.crit[sel] * p1["serial_s_per_token"] + f.merges[sel] * p1["merge_s"]
    sel = f.regime == 1
    if sel.any():
        graph = np.array([pd["graph_s"][str(b)] for b in f.buckets])
        rate = {k: np.where(f.big[sel], pd["big"][k], pd["small"][k]) for k in DECODE_ATTENTION}
        tb, C = rate["block_s"], model.decode_wave
        rb = model.block_bytes / (rate["kv_gbs"] * 1e9)
        P, blk = f.programs[sel], f.blocks[sel]
        full = np.floor(P / C)
        rest = P - full * C
        lat = (blk + 1) * tb
        waves = full * np.maximum(lat, C * blk * rb) + np.where(rest > 0, lat + rate["tail"] * rest * blk * rb, 0.0)
        attention = (np.maximum(waves, (f.crit[sel] + 1) * tb) + f.merges[sel] * rate["merge_s"]
                     + P * rate["program_s"]
                     + np.maximum(0.0, f.padded[sel] - pd["spread_from"]) * f.dlive[sel] * rate["spread_s"])
        out[sel] = graph[f.graph[sel]] + attention
    sel = f.regime == 2
    if sel.any():
        weights = c["weight_bytes"] / (pp["weight_gbs"] * 1e9)
        projections = f.m[sel] * c["flops_per_token"] / (pp["matmul_tflops"] * 1e12)
        P = f.programs[sel]
        waves = f.waves[sel]
        attention = np.maximum(f.crit[sel] * pp["block_s"] + pp["program_s"],
                               waves * np.where(waves > 1, pp["shared"], 1.0) * (f.blocks[sel] / P * pp["block_s"]
                                                                                 + pp["program_s"]))
        out[sel] = (pp["fixed_s"] + smoothed(weights, projections, pp.get("smooth", 0.0)) + attention
                    + f.seqs[sel] * pp["per_seq_s"]
                    + f.eager[sel] * pp["eager_s"])
    return out


def check_coverage(passes: list[PassRecord]) -> None:
    """Enough passes of every regime, and the variety each term needs, or an error naming the
    shapes to add."""
    counts = {"decode1": 0, "decode": 0, "prefill": 0}
    for p in passes:
        counts[regime(p.new_tokens)] += 1
    what = {"decode1": "one sequence decoding (batch 1) at several context lengths",
            "decode": "batches of 2 or more sequences decoding, across batch sizes and contexts",
            "prefill": "prompts and prompt chunks (and mixed passes) of several lengths"}
    for r, n in counts.items():
        if n < MIN_PASSES[r]:
            raise ValueError(f"too few passes to fit the {r} regime ({n}, need {MIN_PASSES[r]}): time {what[r]}")
    needs = (("decode", lambda p: len(p.new_tokens) >= 64, "decode batches of 64 or more (that fill the GPU)"),
             ("prefill", lambda p: sum(p.new_tokens) >= 2048, "prompts of 2048 tokens or more"),
             ("prefill", lambda p: sum(p.new_tokens) <= 64, "short prompts (64 tokens or fewer)"),
             ("prefill", lambda p: max(p.context_lens) >= 4096, "chunks on a long cached context"),
             ("decode", lambda p: max(p.context_lens) >= 4096, "decode over long contexts"))
    for r, test, need in needs:
        if not any(regime(p.new_tokens) == r and test(p) for p in passes):
            raise ValueError(f"the {r} regime's terms cannot be told apart: the passes lack {need}")


def fit_params(passes: list[PassRecord], c: dict, model: CalibratedCost, spread: tuple = NO_SPREAD,
               prompts_only: bool = False) -> dict:
    """The parameters minimising the passes' relative error, robustly (soft_l1: a repeat far off
    its shape's others pulls less than its square), regime by regime (they share no parameter,
    so each gets its own best of a few starts); decode attention's spread term is `spread`'s
    (`unpack`), fitted apart (`calibrate.mixtures.fit_spread`). `prompts_only`: the prefill
    regime's waves fitted on the passes of prompt tokens alone, not on mixed passes (for a
    calibration whose mixed passes have a form of their own, `fit_mixed`: the waves then price
    none of the sweep's mixed passes, and a decode row's tile, which walks its whole context,
    would only bend them)."""
    check_coverage(passes)
    f = Design.of(passes, model)
    owner = np.array([r for r, _ in layout(f.buckets)])
    theta = initial(f.buckets)
    mixed = np.array([p.kind == "mixed" for p in passes])
    for r in (0, 1, 2):
        rows, idx = (f.regime == r) & ~(prompts_only & (r == 2) & mixed), owner == r
        part = f.rows(rows)

        def residuals(sub, part=part, idx=idx):
            full = theta.copy()
            full[idx] = sub
            return predict(unpack(full, f.buckets, spread), c, part, model) / part.seconds - 1.0

        best = None
        for scale in (1.0, 0.3, 3.0):
            result = least_squares(residuals, theta[idx] + np.log(scale), method="trf", max_nfev=3000,
                                   loss="soft_l1", f_scale=ROBUST_SCALE)
            if best is None or result.cost < best.cost:
                best = result
        theta[idx] = best.x
    return unpack(theta, f.buckets, spread)


@dataclass
class ErrorRow:
    kind: str            # decode, prefill, mixed
    split: str           # held-out or fitted
    passes: int
    mape: float
    signed_median: float
    worst_group: str
    worst_group_mape: float


def error_table(passes: list[PassRecord], predicted: np.ndarray, split: list[str]) -> list[ErrorRow]:
    """MAPE, signed median error and worst shape group, per pass kind and split."""
    rel = np.array([pr / p.duration_s - 1 for p, pr in zip(passes, predicted)])
    kinds = np.array([p.kind for p in passes])
    groups = np.array([group_of(p) for p in passes])
    split = np.asarray(split)
    rows = []
    for kind in ("decode", "prefill", "mixed"):
        for part in ("held-out", "fitted"):
            sel = (kinds == kind) & (split == part)
            if not sel.any():
                continue
            by_group = {g: float(np.mean(np.abs(rel[sel & (groups == g)]))) for g in set(groups[sel])}
            worst = max(by_group, key=by_group.get)
            rows.append(ErrorRow(kind, part, int(sel.sum()), float(np.mean(np.abs(rel[sel]))),
                                 float(np.median(rel[sel])), worst, by_group[worst]))
    return rows


def roofline_prior_error(passes: list[PassRecord], model: ModelConfig, gpu) -> list[dict]:
    """How far the roofline alone (no fitted term, no overhead) is from the measured passes, per
    regime: the error to expect from a projection to a GPU that was never measured."""
    roof = RooflineCost(model, gpu, overhead_s=0.0)
    out = []
    for r in ("decode1", "decode", "prefill"):
        sel = [p for p in passes if regime(p.new_tokens) == r]
        if not sel:
            continue
        rel = np.array([roof.pass_time(p.new_tokens, p.context_lens) / p.duration_s - 1 for p in sel])
        out.append({"regime": r, "passes": len(sel), "mape": float(np.mean(np.abs(rel))),
                    "signed_median": float(np.median(rel))})
    return out


PER = {"block_s": "block", "merge_s": "slice merged", "program_s": "program",
       "spread_s": "row and slice the longest sequence's last waits for"}


def _show(name: str, v: float) -> str:
    unit = UNITS[name]
    if name == "serial_s_per_token":
        return f"serial {v * 1e9:.2f} ns/position"
    if name == "shared":
        return f"shared {v:.3f} (a wave's time, past the first)"
    if name == "smooth":
        return f"smooth {v:.2f} (the k of the weights' and projections' k-norm; 0: their max)"
    if name == "tail":
        return f"tail {v:.3f} (the last wave's reads, of their time at kv)"
    if name in PER:
        return f"{name.removesuffix('_s')} {v * 1e9:,.1f} ns/{PER[name]}"
    short = name.removesuffix("_s").removesuffix("_gbs").removesuffix("_tflops")
    return f"{short} {v * 1e6:.1f} us" if unit == "s" else f"{short} {v:,.0f} {unit}"


def format_params(params: dict) -> str:
    """The fitted parameters with their units, a line per regime."""
    d = params["decode"]
    graph = d["graph_s"]
    sizes = sorted(graph, key=int)
    lines = ["  decode1  " + ", ".join(_show(k, params["decode1"][k]) for k in DECODE1),
             f"  decode   graph {graph[sizes[0]] * 1e3:.3f} ms at batch {sizes[0]} .. {graph[sizes[-1]] * 1e3:.3f} ms at "
             f"{sizes[-1]}; small batches: "
             + ", ".join(_show(k, d["small"][k]) for k in DECODE_ATTENTION) + "; full: "
             + ", ".join(_show(k, d["big"][k]) for k in DECODE_ATTENTION)
             + f"; spread from {d.get('spread_from', 0.0):g} sequences"
             + (f"; full batches' attention as scheduled (sim.schedule): shared {d['schedule']['kv_gbs']:,.0f} GB/s, "
                f"a block alone {d['schedule']['block_s'] * 1e6:.1f} us, a start {d['schedule']['start_s'] * 1e6:.1f} us"
                if d.get("schedule") else ""),
             "  prefill  " + ", ".join(_show(k, params["prefill"][k]) for k in PREFILL)]
    if params.get("mixed"):
        q = params["mixed"]
        lines.append("  mixed    tiles list-scheduled (sim.schedule): "
                     + ", ".join(_show(k, q[k]) for k in MIXED_RATES)
                     + f", a tile's start {q['start_s'] * 1e6:.1f} us")
    return "\n".join(lines)


def format_errors(rows: list[ErrorRow]) -> str:
    out = [f"  {'kind':<8} {'split':<9} {'passes':>6} {'MAPE':>7} {'median':>8}  worst group"]
    for e in rows:
        out.append(f"  {e.kind:<8} {e.split:<9} {e.passes:>6} {e.mape:>7.2%} {e.signed_median:>+8.2%}  "
                   f"{e.worst_group} ({e.worst_group_mape:.2%})")
    return "\n".join(out)


def mape(predicted, measured) -> float:
    predicted, measured = np.asarray(predicted, float), np.asarray(measured, float)
    return float(np.mean(np.abs(predicted / measured - 1))) if len(measured) else math.nan


SCHEDULE_START = {"kv_gbs": 4800.0, "block_s": 7e-5, "start_s": 4e-5}  # a pass's (every layer's), H200-like


def fit_schedule(passes: list[PassRecord], params: dict, model: CalibratedCost) -> dict:
    """`params` with decode attention of batches that fill the GPU priced by its programs'
    schedule (`sim.schedule`, `CalibratedCost.scheduled_attention`), fitted by `schedule_fit`."""
    rates, graphs = schedule_fit(passes, model)
    out = copy.deepcopy(params)
    out["decode"]["schedule"] = rates
    out["decode"]["graph_s"].update({str(b): t for b, t in graphs.items()})
    return out


def schedule_fit(passes: list[PassRecord], model: CalibratedCost) -> tuple[dict, dict]:
    """(the schedule's rates, {padded batch: graph seconds}) of the decode passes of `passes` that
    fill the GPU: the three rates by least squares on relative error (soft_l1, as the rest), each
    padded batch's graph time the median of what the schedule leaves of its passes."""
    full = [p for p in passes if regime(p.new_tokens) == "decode" and model.fills(len(p.new_tokens))]
    if len(full) < MIN_PASSES["decode"]:
        raise ValueError(f"too few decode passes of batches that fill the GPU to fit their schedule ({len(full)}, "
                         f"need {MIN_PASSES['decode']}): time batches of {model.fills_gpu // model.kv_heads} sequences "
                         "and more")
    B = np.array([bucket(len(p.new_tokens), model.buckets) for p in full])
    seconds = np.array([p.duration_s for p in full])
    runs = [model.scheduled_runs(p.context_lens) for p in full]

    def attention(theta):
        rates = dict(zip(SCHEDULE, np.exp(theta)))
        return np.array([model.scheduled_time(r, rates) for r in runs])

    def graphs(A):
        return {b: float(np.median((seconds - A)[B == b])) for b in np.unique(B).tolist()}

    def residuals(theta):
        A = attention(theta)
        g = graphs(A)
        return (np.array([g[b] for b in B]) + A) / seconds - 1.0

    fit = least_squares(residuals, np.log([SCHEDULE_START[k] for k in SCHEDULE]), loss="soft_l1",
                        f_scale=ROBUST_SCALE, max_nfev=100, diff_step=1e-3)
    return dict(zip(SCHEDULE, np.exp(fit.x).tolist())), graphs(attention(fit.x))


MIXED_STARTS = (0.0, 1.0, 2.0, 3.0, 5.0)  # a tile's start, in block times, tried by `mixed_fit`
MIXED_RATES = tuple(k for k in MIXED if k != "start_s")  # fitted by least squares at each start


def fit_mixed(passes: list[PassRecord], params: dict, model: CalibratedCost) -> dict:
    """`params` with mixed passes priced by their chunk attention's tiles list-scheduled
    (`CalibratedCost.listed`), fitted by `mixed_fit`."""
    return copy.deepcopy(params) | {"mixed": mixed_fit(passes, model, params["prefill"])}


def mixed_fit(passes: list[PassRecord], model: CalibratedCost, start: dict) -> dict:
    """The list-scheduled form's rates (`sim.calibrated.MIXED`), fitted on the prompt and mixed
    passes of `passes` run as graphs by least squares on relative error (soft_l1, as the rest),
    from the waves' `start` rates, for each tile start of MIXED_STARTS: the best."""
    rows = [p for p in passes if regime(p.new_tokens) == "prefill"
            and not model.eager(bucket(sum(p.new_tokens), model.token_buckets))]
    mixed = sum(p.kind == "mixed" for p in rows)
    if mixed < MIN_PASSES["prefill"]:
        raise ValueError(f"too few mixed passes run as CUDA graphs to fit their tiles' schedule "
                         f"({mixed}, need {MIN_PASSES['prefill']}): time decodes "
                         f"beside prompt chunks of up to {model.token_buckets[-1] if model.token_buckets else 0} tokens")
    seconds = np.array([p.duration_s for p in rows])
    m = np.array([bucket(sum(p.new_tokens), model.token_buckets) for p in rows], float)
    seqs = np.array([len(p.new_tokens) for p in rows], float)
    unit = {"block_s": 1.0, "start_s": 0.0}
    best = None
    for r in MIXED_STARTS:
        walk = np.array([model.listed_attention(p.new_tokens, p.context_lens, unit | {"start_s": r}) for p in rows])

        def predict(theta, walk=walk):
            fixed, wgbs, tflops, per_seq, block = np.exp(theta)
            weights = model.weight_bytes / (wgbs * 1e9)
            return fixed + np.maximum(weights, m * model.flops_per_token / (tflops * 1e12)) + block * walk + seqs * per_seq

        theta0 = np.log([start[k] for k in MIXED_RATES])
        fit = least_squares(lambda th: predict(th) / seconds - 1.0, theta0, loss="soft_l1", f_scale=ROBUST_SCALE,
                            method="trf", max_nfev=3000)
        if best is None or fit.cost < best[0]:
            best = (fit.cost, r, np.exp(fit.x))
    _, r, rates = best
    out = dict(zip(MIXED_RATES, rates.tolist()))
    return out | {"start_s": r * out["block_s"]}
