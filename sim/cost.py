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
- `CalibratedCost`: a linear model fitted on measured PassRecords, read from a JSON file.
- `ConstantCost`, `TableCost`: for tests and back-of-envelope runs.

Calibration file (format "llm-sim-cost/v1"):

    {
      "format": "llm-sim-cost/v1",
      "model": "qwen2.5-1.5b",          # the ModelConfig preset it was measured with
      "gpu": "NVIDIA H200",             # free text, for reports
      "dtype": "float16",
      "free_gib": 120.5,                # optional: memory free for the KV cache after loading
      "decode":  {"coef": [c0, c1, c2, c3, c4], "floor_s": 0.0008},
      "prefill": {"coef": [c0, c1, c2, c3, c4], "floor_s": 0.0008},
      "fit": {"passes": 5210, "mape": 0.031, ...}   # optional, free-form: how it was fitted
    }

A pass's time is max(floor_s, coef . x) with the features

    x = [1, batch_size, num_tokens, context_sum, attention]
        batch_size  = len(new_tokens)            num_tokens  = sum(new_tokens)
        context_sum = sum(context_lens)          attention   = sum(n * (c + n))

using "decode" for decode passes (every sequence 1 new token on a non-empty cache, as
`core.records.pass_kind` says) and "prefill" for prefill and mixed passes. Fit each with least
squares on PassRecords of its kind (`pass_features` gives x); floor_s (> 0) guards the fit's
low end, e.g. the fastest pass measured.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol, Sequence

from core.config import ModelConfig, get_preset
from core.records import pass_kind
from core.roofline import GPUSpec, get_gpu

FORMAT = "llm-sim-cost/v1"
FEATURES = ("1", "batch_size", "num_tokens", "context_sum", "attention")
ALWAYS = 1 << 62  # "valid for every pass of any run"


class CostModel(Protocol):
    def pass_time(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float: ...

    def decode_line(self, batch_size: int, context_sum: int) -> tuple[float, float, int] | None: ...


def pass_features(new_tokens: Sequence[int], context_lens: Sequence[int]) -> list[float]:
    """The calibrated model's features of one pass: [1, batch_size, num_tokens, context_sum, attention]."""
    return [1.0, len(new_tokens), sum(new_tokens), sum(context_lens),
            sum(n * (c + n) for n, c in zip(new_tokens, context_lens))]


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


class CalibratedCost:
    """max(floor_s, coef . features), one linear model for decode passes and one for the rest,
    fitted on measured passes (see the module docstring for the file format)."""

    def __init__(self, decode: dict, prefill: dict, model: str = "", gpu: str = "", free_gib: float | None = None,
                 source: str = "calibration"):
        self.model, self.gpu, self.free_gib, self.source = model, gpu, free_gib, source
        self.decode_coef, self.decode_floor = self._part(decode, "decode")
        self.prefill_coef, self.prefill_floor = self._part(prefill, "prefill")

    def _part(self, part: dict, name: str) -> tuple[list[float], float]:
        if not isinstance(part, dict) or "coef" not in part:
            raise ValueError(f"{self.source}: {name!r} must be an object with 'coef' and 'floor_s'")
        coef = part["coef"]
        if not (isinstance(coef, list) and len(coef) == len(FEATURES)
                and all(isinstance(v, (int, float)) for v in coef)):
            raise ValueError(f"{self.source}: {name}.coef must be {len(FEATURES)} numbers, one per "
                             f"feature {list(FEATURES)}; got {coef!r}")
        floor = part.get("floor_s")
        if not isinstance(floor, (int, float)) or floor <= 0:
            raise ValueError(f"{self.source}: {name}.floor_s must be a positive number of seconds, got {floor!r}")
        return [float(v) for v in coef], float(floor)

    @classmethod
    def from_json(cls, path: str | Path, model: str | None = None) -> "CalibratedCost":
        """Load a calibration file; `model`, when given, must be the model it was measured with."""
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"cost model file {path} does not exist") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            got = d.get("format") if isinstance(d, dict) else type(d).__name__
            raise ValueError(f"{path}: expected a calibration file with \"format\": \"{FORMAT}\", got {got!r}")
        for key in ("model", "decode", "prefill"):
            if key not in d:
                raise ValueError(f"{path}: missing {key!r}")
        if model is not None and d["model"] != model:
            raise ValueError(f"{path} is a cost model for {d['model']!r}, but this run simulates {model!r}; "
                             f"calibrate for {model!r} or pass --model {d['model']}")
        return cls(d["decode"], d["prefill"], d["model"], d.get("gpu", ""), d.get("free_gib"), str(path))

    def pass_time(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float:
        x = pass_features(new_tokens, context_lens)
        decode = pass_kind(new_tokens, context_lens) == "decode"
        coef, floor = (self.decode_coef, self.decode_floor) if decode else (self.prefill_coef, self.prefill_floor)
        return max(floor, sum(w * v for w, v in zip(coef, x)))

    def decode_line(self, batch_size: int, context_sum: int) -> tuple[float, float, int]:
        c0, c1, c2, c3, c4 = self.decode_coef
        b = batch_size
        # decode: num_tokens = b, attention = context_sum + b, and the context grows b per pass
        a = c0 + (c1 + c2 + c4) * b + (c3 + c4) * context_sum
        return _upper_line(a, (c3 + c4) * b, self.decode_floor, 0.0)


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


def parse_cost(spec: str, model: str = "qwen2.5-1.5b", overhead_s: float = 3e-4) -> tuple[CostModel, GPUSpec | None]:
    """A cost model from a CLI spec: "roofline:GPU" (a preset of core.roofline),
    "constant:SECONDS", or the path of a calibration JSON for `model`. Returns it and the GPU
    preset it names (None for the others)."""
    kind, sep, arg = spec.partition(":")
    if kind == "roofline" and sep:
        gpu = get_gpu(arg)
        return RooflineCost(get_preset(model), gpu, overhead_s), gpu
    if kind == "constant" and sep:
        try:
            return ConstantCost(float(arg)), None
        except ValueError as e:
            raise ValueError(f"cost {spec!r}: {e}") from None
    if spec.endswith(".json") or Path(spec).exists():
        return CalibratedCost.from_json(spec, model), None
    raise ValueError(f"cost {spec!r}: expected roofline:GPU, constant:SECONDS or a calibration .json file")
