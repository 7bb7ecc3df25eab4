"""Step-cost models: how long one forward pass takes, from the shape of its batch.

One interface, no base class to inherit:

    pass_time(new_tokens, context_lens) -> seconds
        new_tokens[i] tokens of sequence i go through the model on top of context_lens[i]
        tokens already in its KV cache (the PassRecord's two lists).
    decode_line(batch_size, context_sum) -> (a, b, valid) or None
        For a run of decode passes (one new token per sequence, every context one longer each
        pass) whose first pass has contexts summing to `context_sum`: pass j (from 0) takes
        a + b*j seconds, for j < valid. The simulator uses it to advance such runs in one step;
        None makes it step pass by pass.

Implementations:
- `RooflineCost`: the engine's roofline numbers: max(bytes / bandwidth, FLOPs / peak) plus a
  fixed per-pass overhead.
- `CalibratedCost`: the engine's measured pass times, as a hardware-grounded model fitted on
  passes timed on the GPU (`calibrate/`), read from a JSON file; `calibrated:h200` names the
  committed one.
- `ConstantCost`, `TableCost`: for tests and back-of-envelope runs.

Calibration file (format "llm-sim-cost/v2", written by `python -m calibrate fit` from passes
timed on the real engine; `CalibratedCost` documents the form and its parameters).
"""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Protocol, Sequence

from core.config import ModelConfig, get_preset
from core.roofline import GPUSpec, get_gpu

FORMAT = "llm-sim-cost/v2"
ALWAYS = 1 << 62  # "valid for every pass of any run"


class CostModel(Protocol):
    def pass_time(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float: ...

    def decode_line(self, batch_size: int, context_sum: int) -> tuple[float, float, int] | None: ...


def _upper_line(a0: float, a1: float, b0: float, b1: float) -> tuple[float, float, int]:
    """max(a0 + a1*j, b0 + b1*j) over j >= 0 as the line on top at j = 0 and how many j it stays
    on top for (two lines cross at most once)."""
    if (b0, b1) > (a0, a1):
        a0, a1, b0, b1 = b0, b1, a0, a1
    if a1 >= b1:
        return a0, a1, ALWAYS
    return a0, a1, int((a0 - b0) / (b1 - a1)) + 1


class RooflineCost:
    """A pass reads the weights and the KV cache and does its FLOPs; it takes the longer of
    bytes / bandwidth and FLOPs / peak, plus `overhead_s`.

    bytes = weight bytes + (context + new tokens) x KV bytes per token (read, and written);
    FLOPs = new tokens x ModelConfig.flops_per_token() + attention: a new token at position p
    attends to p positions, at the per-position cost of ModelConfig.flops_per_token.
    overhead_s defaults to 0.3 ms, a CUDA-graph decode step's launch and host overhead.
    """

    def __init__(self, model: ModelConfig, gpu: GPUSpec, overhead_s: float = 3e-4, dtype_bytes: int = 2):
        if overhead_s < 0:
            raise ValueError(f"overhead_s must be >= 0, got {overhead_s}")
        self.model, self.gpu, self.overhead_s = model, gpu, overhead_s
        self.weight_bytes = model.weight_bytes_read_per_pass(dtype_bytes)
        self.kv_bytes = model.kv_bytes_per_token(dtype_bytes)
        self.flops_per_token = model.flops_per_token(0)
        self.attn_flops = model.flops_per_token(1) - self.flops_per_token  # per attended position
        self.bandwidth = gpu.bandwidth_gbs * 1e9
        self.peak = gpu.fp16_tflops * 1e12

    def pass_time(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float:
        n = c = positions = 0
        for x, y in zip(new_tokens, context_lens):
            n += x
            c += y
            positions += x * (2 * y + x + 1)  # twice the positions x new tokens attend to
        memory = (self.weight_bytes + self.kv_bytes * (c + n)) / self.bandwidth
        compute = (self.flops_per_token * n + self.attn_flops * (positions // 2)) / self.peak
        return self.overhead_s + (memory if memory > compute else compute)

    def decode_line(self, batch_size: int, context_sum: int) -> tuple[float, float, int]:
        b, c = batch_size, context_sum
        m0 = (self.weight_bytes + self.kv_bytes * (c + b)) / self.bandwidth
        m1 = self.kv_bytes * b / self.bandwidth
        f0 = (self.flops_per_token * b + self.attn_flops * (c + b)) / self.peak
        f1 = self.attn_flops * b / self.peak
        a, slope, valid = _upper_line(m0, m1, f0, f1)
        return self.overhead_s + a, slope, valid


REGIMES = ("decode1", "decode", "prefill")
PARAMETERS = {  # name: (unit in the file, what it is)
    "launch_s": ("s", "fixed time of a pass: launches, synchronisation, small kernels"),
    "weight_gbs": ("GB/s", "rate at which the pass reads the weights"),
    "matmul_tflops": ("TFLOP/s", "rate of the projections once the tokens make them compute-bound"),
    "kv_gbs": ("GB/s", "rate at which attention reads the KV cache"),
    "attention_tflops": ("TFLOP/s", "rate of attention's arithmetic (long prompts)"),
    "per_seq_s": ("s", "time per sequence in the pass"),
}


def bucket(batch: int, buckets: Sequence[int]) -> int:
    """The padded batch a CUDA graph runs `batch` rows at: the smallest bucket that holds them
    (the batch itself past the largest bucket, run without a graph)."""
    for b in buckets:
        if b >= batch:
            return b
    return batch


class CalibratedCost:
    """The continuous engine's pass time, fitted on passes timed on a GPU (`calibrate/`).

    Each pass falls in a regime: `decode1` (one sequence decoding: the fused batch-1 kernels),
    `decode` (every sequence decodes: a CUDA graph at the padded batch `bucket(S)`), `prefill`
    (anything else: prompts, chunks, mixed passes, launched kernel by kernel). In each

        t = launch_s + max(weights / weight_gbs, M * matmul_flops / matmul_tflops)
              + kv_read * kv_bytes / kv_gbs + attention_pairs * attention_flops / attention_tflops
              + S * per_seq_s

    M: tokens through the projections (the padded batch for `decode`, 1 for `decode1`, the
    tokens of the pass for `prefill`, padded to the token bucket of its graph when it has one); kv_read: positions of cache attended (sum of context +
    new tokens); attention_pairs: query-key pairs (causal within a chunk); S: sequences. The
    constants (weight bytes, FLOPs per token, KV bytes per token, attention FLOPs per pair) come
    from the model's shape; the parameters, per regime, from the fit. A parameter of 0 (or
    absent) drops its term.
    """

    def __init__(self, d: dict, source: str = "calibration"):
        self.source = source
        self.model, self.gpu = d["model"], d.get("gpu", "")
        self.free_gib, self.kv_blocks = d.get("free_gib"), d.get("kv_blocks")
        self.buckets = sorted(int(b) for b in d.get("graph_buckets", []))
        self.token_buckets = sorted(int(b) for b in d.get("token_buckets", []))
        c = d["constants"]
        self.weight_bytes, self.flops_per_token = float(c["weight_bytes"]), float(c["flops_per_token"])
        self.kv_bytes, self.pair_flops = float(c["kv_bytes_per_token"]), float(c["attention_flops_per_pair"])
        self.params = {r: self._regime(d["parameters"], r) for r in REGIMES}

    def _regime(self, params: dict, regime: str) -> tuple[float, ...]:
        part = params.get(regime)
        if not isinstance(part, dict):
            raise ValueError(f"{self.source}: parameters.{regime} must be an object of {list(PARAMETERS)}")
        values = []
        for name in PARAMETERS:
            v = part.get(name, 0.0)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{self.source}: parameters.{regime}.{name} must be a finite number >= 0, got {v!r}")
            values.append(float(v))
        return tuple(values)

    @staticmethod
    def regime(new_tokens: Sequence[int], context_lens: Sequence[int] = ()) -> str:
        if all(n == 1 for n in new_tokens):
            return "decode1" if len(new_tokens) == 1 else "decode"
        return "prefill"

    def terms(self, regime: str, m: int, kv_read: float, pairs: float, seqs: int) -> list[float]:
        """The model's terms for one pass, seconds: launch, weights or matmuls, KV, attention, sequences."""
        launch, wgbs, tflops, kvgbs, atflops, per_seq = self.params[regime]
        weights = self.weight_bytes / (wgbs * 1e9) if wgbs else 0.0
        matmul = m * self.flops_per_token / (tflops * 1e12) if tflops else 0.0
        return [launch, max(weights, matmul), kv_read * self.kv_bytes / (kvgbs * 1e9) if kvgbs else 0.0,
                pairs * self.pair_flops / (atflops * 1e12) if atflops else 0.0, seqs * per_seq]

    def pass_time(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float:
        regime = self.regime(new_tokens)
        seqs = len(new_tokens)
        kv_read = pairs = 0
        for n, c in zip(new_tokens, context_lens):
            kv_read += c + n
            pairs += n * (2 * c + n + 1)  # twice the causal query-key pairs
        m = seqs if regime != "prefill" else bucket(sum(new_tokens), self.token_buckets)
        if regime == "decode":
            m = bucket(seqs, self.buckets)
        return sum(self.terms(regime, m, kv_read, pairs / 2, seqs))

    def decode_line(self, batch_size: int, context_sum: int) -> tuple[float, float, int]:
        regime = "decode1" if batch_size == 1 else "decode"
        m = 1 if batch_size == 1 else bucket(batch_size, self.buckets)
        a = sum(self.terms(regime, m, context_sum + batch_size, context_sum + batch_size, batch_size))
        slope = sum(self.terms(regime, m, batch_size, batch_size, 0)) - sum(self.terms(regime, m, 0, 0, 0))
        return a, slope, ALWAYS

    def projected(self, gpu: GPUSpec, measured_on: GPUSpec) -> "CalibratedCost":
        """This model moved to another GPU by the ratio of the two cards' bandwidths (weights, KV)
        and arithmetic rates (matmuls, attention); fixed costs (launch, per sequence) stay. A
        projection, not a measurement: `calibrate fit` reports how far the roofline alone is
        from the measured card, the size of error to expect."""
        bw, fl = gpu.bandwidth_gbs / measured_on.bandwidth_gbs, gpu.fp16_tflops / measured_on.fp16_tflops
        out = copy.copy(self)
        out.params = {r: (p[0], p[1] * bw, p[2] * fl, p[3] * bw, p[4] * fl, p[5]) for r, p in self.params.items()}
        out.gpu, out.free_gib, out.kv_blocks = f"{gpu.name} (projected from {self.gpu})", None, None
        return out

    @classmethod
    def from_json(cls, path: str | Path, model: str | None = None) -> "CalibratedCost":
        """Load a calibration file; `model`, when given, must be the model it was measured with."""
        path = Path(path)
        if path.is_dir():
            raise ValueError(f"cost model file {path} is a directory")
        try:
            d = json.loads(path.read_text(), parse_constant=_refuse_constant)
        except FileNotFoundError:
            raise ValueError(f"cost model file {path} does not exist") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            got = d.get("format") if isinstance(d, dict) else type(d).__name__
            raise ValueError(f"{path}: expected a calibration file with \"format\": \"{FORMAT}\", got {got!r}")
        for key in ("model", "constants", "parameters"):
            if key not in d:
                raise ValueError(f"{path}: missing {key!r}")
        if model is not None and d["model"] != model:
            raise ValueError(f"{path} is a cost model for {d['model']!r}, but this run simulates {model!r}; "
                             f"calibrate for {model!r} or pass --model {d['model']}")
        try:
            return cls(d, str(path))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: {e}") from None


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number a cost model can use")


class ConstantCost:
    """Every pass takes `seconds` (queueing-theory tests, what-ifs on a fixed step time)."""

    def __init__(self, seconds: float):
        if seconds <= 0:
            raise ValueError(f"a pass must take a positive time, got {seconds}")
        self.seconds = seconds

    def pass_time(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float:
        return self.seconds

    def decode_line(self, batch_size: int, context_sum: int) -> tuple[float, float, int]:
        return self.seconds, 0.0, ALWAYS


class TableCost:
    """A pass's time looked up by its token count: linear between the given points, flat
    beyond the first and last."""

    def __init__(self, seconds_by_tokens: dict[int, float]):
        if not seconds_by_tokens or any(v <= 0 for v in seconds_by_tokens.values()):
            raise ValueError("TableCost needs at least one point, all times positive")
        self.points = sorted(seconds_by_tokens.items())

    def time_for(self, num_tokens: int) -> float:
        pts = self.points
        if num_tokens <= pts[0][0]:
            return pts[0][1]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            if num_tokens <= x1:
                return y0 + (y1 - y0) * (num_tokens - x0) / (x1 - x0)
        return pts[-1][1]

    def pass_time(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float:
        return self.time_for(sum(new_tokens))

    def decode_line(self, batch_size: int, context_sum: int) -> tuple[float, float, int]:
        return self.time_for(batch_size), 0.0, ALWAYS


CALIBRATIONS = Path(__file__).resolve().parents[1] / "results" / "calibration"


def parse_cost(spec: str, model: str = "qwen2.5-1.5b", overhead_s: float = 3e-4) -> tuple[CostModel, GPUSpec | None]:
    """A cost model from a CLI spec: "roofline:GPU" (a preset of core.roofline), "constant:SECONDS",
    "calibrated:NAME" (results/calibration/NAME.json, e.g. calibrated:h200), "calibrated:NAME@GPU"
    (that calibration projected to another GPU preset), or the path of a calibration JSON for
    `model`. Returns it and the GPU preset it stands for (None when it names none)."""
    kind, sep, arg = spec.partition(":")
    if kind == "roofline" and sep:
        gpu = get_gpu(arg)
        return RooflineCost(get_preset(model), gpu, overhead_s), gpu
    if kind == "constant" and sep:
        try:
            seconds = float(arg)
        except ValueError:
            raise ValueError(f"--cost {spec!r}: {arg!r} is not a number of seconds") from None
        if not math.isfinite(seconds):
            raise ValueError(f"--cost {spec!r}: a pass must take a finite time")
        return ConstantCost(seconds), None
    if kind == "calibrated" and sep:
        name, at, target = arg.partition("@")
        path = CALIBRATIONS / f"{name}.json"
        if not path.exists():
            known = ", ".join(sorted(p.stem for p in CALIBRATIONS.glob("*.json"))) or "none"
            raise ValueError(f"--cost {spec!r}: no calibration named {name!r} (known: {known})")
        cost = CalibratedCost.from_json(path, model)
        measured_on = gpu_preset(cost.gpu)[1]
        if not at:
            return cost, measured_on
        gpu = get_gpu(target)
        if measured_on is None:
            raise ValueError(f"--cost {spec!r}: {path} was measured on {cost.gpu!r}, which no GPU preset "
                             f"describes; it cannot be projected")
        return cost.projected(gpu, measured_on), gpu
    if spec.endswith(".json") or Path(spec).exists():
        cost = CalibratedCost.from_json(spec, model)
        return cost, gpu_preset(cost.gpu)[1]
    raise ValueError(f"--cost {spec!r}: expected roofline:GPU, constant:SECONDS, calibrated:NAME[@GPU] or a "
                     f"calibration .json file")


def gpu_preset(name: str) -> tuple[str | None, GPUSpec | None]:
    """The preset (its key and spec) of a GPU named as torch names it ("NVIDIA H200"): the
    measured one when there is one; (None, None) when no preset describes it."""
    from core.roofline import GPUS
    named = [(k, v) for k, v in GPUS.items() if v.name == name]
    measured = [(k, v) for k, v in named if v.source.startswith("measured")]
    return (measured or named or [(None, None)])[0]
