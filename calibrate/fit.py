"""Fitting the step-cost model (`sim.cost.CalibratedCost`) to timed passes, and its error.

The model's form is the hardware's: a pass reads the weights (or, with enough tokens, is bound
by the projections' arithmetic), reads the KV cache it attends to, does attention's arithmetic,
and pays a fixed cost and a cost per sequence; each in one of three regimes (one sequence
decoding on the fused batch-1 kernels, a batch decoding in a CUDA graph at its padded bucket,
anything else launched kernel by kernel). Fitted with scipy on relative error (every pass counts
by its relative miss, so short passes matter as much as long ones). Two parameters are shared
where the same code runs: the projections' arithmetic rate (cuBLAS in decode and prefill) and
the fixed cost of a graph replay (batch 1 and batched).

Error is measured on shapes the fit did not see (whole groups of shapes held out, never random
rows): batch sizes between the graph buckets and one context length for decode, some chunk
sizes and contexts for prefill, one chunk size for mixed passes.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from core.config import ModelConfig
from core.records import PassRecord
from sim.cost import FORMAT, PARAMETERS, REGIMES, CalibratedCost, RooflineCost, bucket

# The parameters each regime fits, and the two shared across regimes.
FREE = {"decode1": ("weight_gbs", "kv_gbs"),
        "decode": ("weight_gbs", "kv_gbs", "per_seq_s"),
        "prefill": ("launch_s", "weight_gbs", "kv_gbs", "attention_tflops", "per_seq_s")}
SHARED = {"matmul_tflops": ("decode", "prefill"), "graph_launch_s": ("decode1", "decode")}
PRIOR = {"launch_s": 5e-4, "weight_gbs": 2000.0, "kv_gbs": 2000.0, "attention_tflops": 300.0, "per_seq_s": 2e-6,
         "matmul_tflops": 500.0, "graph_launch_s": 5e-5}
MIN_PASSES = {"decode1": 6, "decode": 12, "prefill": 12}


def constants(model: ModelConfig, dtype_bytes: int = 2) -> dict:
    """The model's shape, in the units the cost model multiplies by."""
    return {"weight_bytes": model.weight_bytes_read_per_pass(dtype_bytes),
            "flops_per_token": model.flops_per_token(0),
            "kv_bytes_per_token": model.kv_bytes_per_token(dtype_bytes),
            "attention_flops_per_pair": model.flops_per_token(1) - model.flops_per_token(0)}


def regime_of(p: PassRecord) -> str:
    return CalibratedCost.regime(p.new_tokens)


def report_kind(p: PassRecord) -> str:
    """decode, prefill or mixed: how the error is reported."""
    return p.kind


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
    """Decode: batch sizes between the graph buckets, and contexts of 2048; prefill: chunks of
    1024 or 8192 tokens and contexts of 1024; mixed: chunks near 1024 tokens; prompt groups by a
    fixed hash."""
    words = group.split()
    if words[0] == "decode":
        b = int(words[1][1:])
        return b not in buckets or words[2] == "c2048"
    if words[0] == "prefill":
        return words[1] in ("n1024", "n8192") or words[2] == "c1024"
    if words[0] == "mixed":
        return 900 <= int(words[1][1:]) <= 1100
    return zlib.crc32(group.encode()) % 3 == 0


@dataclass
class Features:
    """Per pass, what the model multiplies its parameters by."""

    regime: np.ndarray     # regime index
    m: np.ndarray          # tokens through the projections (padded for graph decode)
    kv_read: np.ndarray
    pairs: np.ndarray
    seqs: np.ndarray
    seconds: np.ndarray

    @classmethod
    def of(cls, passes: list[PassRecord], buckets: list[int], token_buckets: list[int] = ()) -> "Features":
        regime, m, kv, pairs, seqs, sec = [], [], [], [], [], []
        for p in passes:
            r = regime_of(p)
            s = len(p.new_tokens)
            regime.append(REGIMES.index(r))
            m.append(1 if r == "decode1" else bucket(s, buckets) if r == "decode" else
                     bucket(sum(p.new_tokens), token_buckets))
            kv.append(sum(c + n for c, n in zip(p.context_lens, p.new_tokens)))
            pairs.append(sum(n * (2 * c + n + 1) for c, n in zip(p.context_lens, p.new_tokens)) / 2)
            seqs.append(s)
            sec.append(p.duration_s)
        return cls(*(np.asarray(a, float) for a in (regime, m, kv, pairs, seqs, sec)))


def unpack(theta: np.ndarray) -> dict[str, dict[str, float]]:
    """Parameter vector (logs) -> per-regime parameter dicts (absent ones 0)."""
    values = iter(np.exp(theta))
    params = {r: {name: 0.0 for name in PARAMETERS} for r in REGIMES}
    for r in REGIMES:
        for name in FREE[r]:
            params[r][name] = float(next(values))
    matmul, graph_launch = float(next(values)), float(next(values))
    for r in SHARED["matmul_tflops"]:
        params[r]["matmul_tflops"] = matmul
    for r in SHARED["graph_launch_s"]:
        params[r]["launch_s"] = graph_launch
    return params


def initial() -> np.ndarray:
    names = [n for r in REGIMES for n in FREE[r]] + list(SHARED)
    return np.log([PRIOR[n] for n in names])


def predict(params: dict, c: dict, f: Features) -> np.ndarray:
    """The model's pass times for the passes in `f` (vectorised)."""
    out = np.zeros_like(f.seconds)
    for i, r in enumerate(REGIMES):
        sel = f.regime == i
        if not sel.any():
            continue
        p = params[r]
        weights = c["weight_bytes"] / (p["weight_gbs"] * 1e9) if p["weight_gbs"] else 0.0
        matmul = f.m[sel] * c["flops_per_token"] / (p["matmul_tflops"] * 1e12) if p["matmul_tflops"] else 0.0
        t = p["launch_s"] + np.maximum(weights, matmul)
        if p["kv_gbs"]:
            t = t + f.kv_read[sel] * c["kv_bytes_per_token"] / (p["kv_gbs"] * 1e9)
        if p["attention_tflops"]:
            t = t + f.pairs[sel] * c["attention_flops_per_pair"] / (p["attention_tflops"] * 1e12)
        out[sel] = t + f.seqs[sel] * p["per_seq_s"]
    return out


def check_coverage(passes: list[PassRecord]) -> None:
    """Enough passes of every regime, and the variety each term needs, or an error naming the
    shapes to add."""
    counts = {r: 0 for r in REGIMES}
    for p in passes:
        counts[regime_of(p)] += 1
    what = {"decode1": "one sequence decoding (batch 1) at several context lengths",
            "decode": "batches of 2 or more sequences decoding, across batch sizes and contexts",
            "prefill": "prompts and prompt chunks (and mixed passes) of several lengths"}
    for r, n in counts.items():
        if n < MIN_PASSES[r]:
            raise ValueError(f"too few passes to fit the {r} regime ({n}, need {MIN_PASSES[r]}): time {what[r]}")
    for r, test, need in (("decode", lambda p: len(p.new_tokens) >= 256, "decode batches of 256 or more (where the "
                                                                           "projections turn compute-bound)"),
                          ("prefill", lambda p: sum(p.new_tokens) >= 2048, "prompts of 2048 tokens or more"),
                          ("prefill", lambda p: sum(p.new_tokens) <= 64, "short prompts (64 tokens or fewer)"),
                          ("decode", lambda p: len(set(p.context_lens)) > 1 or p.context_lens[0] >= 4096,
                           "decode over long or mixed contexts")):
        if not any(regime_of(p) == r and test(p) for p in passes):
            raise ValueError(f"the {r} regime's terms cannot be told apart: the passes lack {need}")


def fit_params(passes: list[PassRecord], c: dict, buckets: list[int], token_buckets: list[int] = ()) -> dict:
    """The parameters minimising the passes' relative error (a few starts, the best kept)."""
    check_coverage(passes)
    f = Features.of(passes, buckets, token_buckets)

    def residuals(theta):
        return predict(unpack(theta), c, f) / f.seconds - 1.0

    best = None
    for scale in (1.0, 0.5, 2.0):
        result = least_squares(residuals, initial() + np.log(scale), method="trf", x_scale=1.0, max_nfev=4000)
        if best is None or result.cost < best.cost:
            best = result
    return unpack(best.x)


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
    kinds = np.array([report_kind(p) for p in passes])
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


def calibration_file(params: dict, c: dict, meta: dict, buckets: list[int], token_buckets: list[int],
                     errors: list[ErrorRow], prior: list[dict], replays: list[dict]) -> dict:
    return {"format": FORMAT, **meta, "graph_buckets": buckets, "token_buckets": token_buckets, "constants": c,
            "parameters": params,
            "units": {name: unit for name, (unit, _) in PARAMETERS.items()},
            "error": [e.__dict__ for e in errors], "roofline_prior_error": prior, "replays": replays}


def roofline_prior_error(passes: list[PassRecord], model: ModelConfig, gpu) -> list[dict]:
    """How far the roofline alone (no fitted term, no overhead) is from the measured passes, per
    regime: the error to expect from a projection to a GPU that was never measured."""
    roof = RooflineCost(model, gpu, overhead_s=0.0)
    out = []
    for r in REGIMES:
        sel = [p for p in passes if regime_of(p) == r]
        if not sel:
            continue
        rel = np.array([roof.pass_time(p.new_tokens, p.context_lens) / p.duration_s - 1 for p in sel])
        out.append({"regime": r, "passes": len(sel), "mape": float(np.mean(np.abs(rel))),
                    "signed_median": float(np.median(rel))})
    return out


def format_params(params: dict) -> str:
    """The fitted parameters with their units, a line per regime."""
    lines = []
    for r in REGIMES:
        p = params[r]
        parts = []
        for name, (unit, _) in PARAMETERS.items():
            v = p[name]
            if not v:
                continue
            text = f"{v * 1e6:.1f} us" if unit == "s" else f"{v:,.0f} {unit}"
            parts.append(f"{name.removesuffix('_s').removesuffix('_gbs').removesuffix('_tflops')} {text}")
        lines.append(f"  {r:<8} " + ", ".join(parts))
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
