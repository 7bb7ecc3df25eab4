"""The continuous engine's measured pass time: the cost model `calibrate fit` writes and the
simulator reads (`--cost calibrated:h200`, or a file in the format "llm-sim-cost/v2").

A pass falls in one of three regimes, as the engine runs it:

- `decode1`: one sequence decoding (the fused batch-1 kernels, one CUDA graph);
- `decode`: every sequence decoding (a CUDA graph at the padded batch `bucket(S)`);
- `prefill`: anything else: prompts, chunks, mixed passes (a graph at the token count padded to
  a power of two up to 8,192, kernel by kernel beyond).

Its time, S sequences, sequence i putting n_i tokens through on top of c_i cached ones:

    decode1:  fixed_s + kv + serial
    decode:   graph_s[bucket(S)] + kv + serial + S * per_seq_s
    prefill:  fixed_s + max(weights, projections) + max(kv + attention, serial) + S * per_seq_s

    weights     = weight_bytes / weight_gbs             (the weight read a pass does once)
    projections = M * flops_per_token / matmul_tflops   (M: the tokens, padded to the graph's)
    kv          = sum(c_i + n_i) * kv_bytes_per_token / kv_gbs
    attention   = sum(n_i (2 c_i + n_i + 1) / 2) * attention_flops_per_pair / attention_tflops
    serial      = positions on attention's critical path * serial_s_per_token

The critical path is the most positions one attention program walks: in decode, the longest
slice of the longest context (the engine's decode attention cuts each context into up to
`slices` slices of at least `shortest` positions, whole blocks of `block_n`; in a batch of
`fills_gpu` or more (sequence, KV head) pairs, the second slicing); in prefill, the longest
context + chunk (chunk attention walks it in one program). `graph_s` holds, per decode bucket,
the time of the graph itself (weights, projections, everything not attention): a measured
table, for cuBLAS's time does not follow M smoothly. Decode's kv and serial rates have a value
for small batches and one for batches that fill the GPU.
"""
from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path
from typing import Sequence

from core.roofline import GPUSpec
from sim.host import HostTime
from traces.trace import MAX_ARRIVAL_S

FORMAT = "llm-sim-cost/v2"
ALWAYS = 1 << 62
# Bounds on a file's numbers, so that no pass takes longer than the longest trace (or forever):
# times at most MAX_ARRIVAL_S (1e8 s), a rate 0 (its term off) or at least MIN_RATE per second.
MIN_RATE = 1e-6
UNITS = {"fixed_s": "s", "graph_s": "s", "per_seq_s": "s", "serial_s_per_token": "s",
         "weight_gbs": "GB/s", "kv_gbs": "GB/s", "matmul_tflops": "TFLOP/s", "attention_tflops": "TFLOP/s"}


def bucket(n: int, buckets: Sequence[int]) -> int:
    """The padded size a CUDA graph runs n rows at: the smallest bucket that holds them (n itself
    past the largest bucket, run without a graph)."""
    for b in buckets:
        if b >= n:
            return b
    return n


def regime(new_tokens: Sequence[int]) -> str:
    if all(n == 1 for n in new_tokens):
        return "decode1" if len(new_tokens) == 1 else "decode"
    return "prefill"


class CalibratedCost:
    """A calibration file's model (see the module docstring)."""

    def __init__(self, d: dict, source: str = "calibration"):
        self.source = source
        self.model, self.gpu = d["model"], d.get("gpu", "")
        self.free_gib, self.kv_blocks = d.get("free_gib"), d.get("kv_blocks")
        for key in ("free_gib", "kv_blocks"):
            if d.get(key) is not None:
                self._positive(d[key], key)
        self.buckets = sorted(self._whole(b, "graph_buckets") for b in d.get("graph_buckets", []))
        self.token_buckets = sorted(self._whole(b, "token_buckets") for b in d.get("token_buckets", []))
        c = d["constants"]
        self.weight_bytes = self._positive(c["weight_bytes"], "constants.weight_bytes")
        self.flops_per_token = self._positive(c["flops_per_token"], "constants.flops_per_token")
        self.kv_bytes = self._positive(c["kv_bytes_per_token"], "constants.kv_bytes_per_token")
        self.pair_flops = self._positive(c["attention_flops_per_pair"], "constants.attention_flops_per_pair")
        a = d["decode_attention"]
        self.kv_heads, self.fills_gpu, self.block_n = (self._whole(a[k], f"decode_attention.{k}")
                                                       for k in ("kv_heads", "fills_gpu", "block_n"))
        self.slicing = {big: self._slicing(a[part], f"decode_attention.{part}")
                        for big, part in ((False, "small"), (True, "big"))}
        p = d["parameters"]
        self.p1 = self._values(p, "decode1", ("fixed_s", "kv_gbs", "serial_s_per_token"))
        self.pd = self._values(p, "decode", ("per_seq_s",))
        self.pd_rates = {big: self._values(p["decode"], part, ("kv_gbs", "serial_s_per_token"), f"decode.{part}")
                         for big, part in ((False, "small"), (True, "big"))}
        graph = p["decode"].get("graph_s")
        if not isinstance(graph, dict) or not graph:
            raise ValueError(f"{source}: parameters.decode.graph_s must map decode buckets to seconds")
        self.graph_s = {self._whole(k, "parameters.decode.graph_s"): self._number(v, f"decode.graph_s.{k}")
                        for k, v in graph.items()}
        self.pp = self._values(p, "prefill", ("fixed_s", "weight_gbs", "matmul_tflops", "kv_gbs", "attention_tflops",
                                              "serial_s_per_token", "per_seq_s"))
        self.host = HostTime.from_dict(d.get("host"), source)  # optional: the engine's host time (sim.host)

    def _number(self, v, where: str) -> float:
        """A parameter: seconds from 0 to MAX_ARRIVAL_S, or a rate (GB/s, TFLOP/s) of 0 or at least MIN_RATE."""
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{self.source}: parameters.{where} must be a finite number >= 0, got {v!r}")
        if where.endswith(("_gbs", "_tflops")):
            if 0 < v < MIN_RATE:
                raise ValueError(f"{self.source}: parameters.{where} must be 0 (term off) or at least {MIN_RATE:g}, "
                                 f"got {v!r}")
        elif v > MAX_ARRIVAL_S:
            raise ValueError(f"{self.source}: parameters.{where} must be at most {MAX_ARRIVAL_S:g} s, got {v!r}")
        return float(v)

    def _positive(self, v, where: str) -> float:
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{self.source}: {where} must be a finite number > 0, got {v!r}")
        return float(v)

    def _whole(self, v, where: str) -> int:
        """A count (a bucket, a block size, a number of heads): a whole number >= 1, or its text (a JSON key)."""
        try:
            n = int(v) if isinstance(v, (int, str)) and not isinstance(v, bool) else None
        except ValueError:
            n = None
        if n is None or n < 1:
            raise ValueError(f"{self.source}: {where} must hold whole numbers >= 1, got {v!r}")
        return n

    def _slicing(self, v, where: str) -> tuple[int, int]:
        """(slices, shortest): at least one slice, of at least 0 positions."""
        if not isinstance(v, (list, tuple)) or len(v) != 2:
            raise ValueError(f"{self.source}: {where} must be [slices, shortest], got {v!r}")
        slices = self._whole(v[0], f"{where}[0]")
        if not isinstance(v[1], int) or isinstance(v[1], bool) or v[1] < 0:
            raise ValueError(f"{self.source}: {where}[1] must be a whole number >= 0, got {v[1]!r}")
        return slices, v[1]

    def _values(self, params: dict, name: str, keys: tuple, where: str | None = None) -> dict:
        part = params.get(name)
        if not isinstance(part, dict):
            raise ValueError(f"{self.source}: parameters.{where or name} must be an object with {list(keys)}")
        return {k: self._number(part.get(k, 0.0), f"{where or name}.{k}") for k in keys}

    # ------------------------------------------------------------------ the terms

    def slice_positions(self, length: int, batch: int) -> int:
        """Positions the longest decode-attention slice of a context of `length` walks."""
        slices, shortest = self.slicing[batch * self.kv_heads >= self.fills_gpu]
        per = -(-(-(-length // slices)) // self.block_n) * self.block_n
        return min(max(per, shortest), length)

    def graph_time(self, b: int) -> float:
        """The decode graph's own time at padded batch b (interpolated between measured buckets,
        extended along the last two past the largest)."""
        table = self.graph_s
        if b in table:
            return table[b]
        keys = sorted(table)
        lo = max((k for k in keys if k < b), default=keys[0])
        hi = min((k for k in keys if k > b), default=None)
        if hi is None:
            lo, hi = keys[-2:] if len(keys) > 1 else (keys[-1], keys[-1])
        if hi == lo:
            return table[lo]
        return table[lo] + (table[hi] - table[lo]) * (b - lo) / (hi - lo)

    @staticmethod
    def _rate(amount: float, per: float, rate: float, scale: float) -> float:
        return amount * per / (rate * scale) if rate else 0.0

    def pass_time(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float:
        r = regime(new_tokens)
        S = len(new_tokens)
        if r != "prefill":
            kv_read = sum(context_lens) + S
            crit = self.slice_positions(max(context_lens) + 1, S)
            return self._decode(r, S, kv_read, crit)
        kv_read = pairs = crit = 0
        for n, c in zip(new_tokens, context_lens):
            kv_read += c + n
            pairs += n * (2 * c + n + 1)
            crit = max(crit, c + n)
        p = self.pp
        m = bucket(sum(new_tokens), self.token_buckets)
        weights = self._rate(self.weight_bytes, 1.0, p["weight_gbs"], 1e9)
        projections = self._rate(m, self.flops_per_token, p["matmul_tflops"], 1e12)
        throughput = self._rate(kv_read, self.kv_bytes, p["kv_gbs"], 1e9) + \
            self._rate(pairs / 2, self.pair_flops, p["attention_tflops"], 1e12)
        return (p["fixed_s"] + max(weights, projections) + max(throughput, crit * p["serial_s_per_token"])
                + S * p["per_seq_s"])

    def _decode(self, r: str, S: int, kv_read: float, crit: float) -> float:
        if r == "decode1":
            p = self.p1
            return p["fixed_s"] + self._rate(kv_read, self.kv_bytes, p["kv_gbs"], 1e9) + crit * p["serial_s_per_token"]
        rates = self.pd_rates[S * self.kv_heads >= self.fills_gpu]
        return (self.graph_time(bucket(S, self.buckets)) + self._rate(kv_read, self.kv_bytes, rates["kv_gbs"], 1e9)
                + crit * rates["serial_s_per_token"] + S * self.pd["per_seq_s"])

    def predict_all(self, passes) -> list[float]:
        """pass_time of every PassRecord."""
        return [self.pass_time(p.new_tokens, p.context_lens) for p in passes]

    def decode_line(self, batch_size: int, context_sum: int, context_max: int | None = None) -> tuple[float, float, int]:
        """Pass j of a run of decode passes (every context one longer each pass) takes a + b*j,
        for j < valid: valid ends where the critical slice's length next changes."""
        S = batch_size
        r = "decode1" if S == 1 else "decode"
        L = (context_max if context_max is not None else context_sum // S) + 1
        slices, shortest = self.slicing[S * self.kv_heads >= self.fills_gpu]
        if L < shortest:  # the whole context is one short slice: it grows with the context
            crit, grows, valid = L, 1, shortest - L
        else:
            crit = self.slice_positions(L, S)
            grows, valid = 0, slices * crit - L + 1
        a = self._decode(r, S, context_sum + S, crit)
        b = self._decode(r, S, context_sum + 2 * S, crit + grows) - a
        return a, b, max(1, valid)

    # ------------------------------------------------------------------ elsewhere

    def projected(self, gpu: GPUSpec, measured_on: GPUSpec) -> "CalibratedCost":
        """This model moved to another GPU: bandwidth terms (weights, KV, the serial walk through
        the cache) by the ratio of the cards' bandwidths, arithmetic (projections, attention) by
        their arithmetic rates, each decode graph's time (and batch 1's fixed time, which is
        mostly the weights' read) by the ratio of the roofline's time for its batch on the two
        cards; the other fixed costs stay. A projection, not a measurement: `calibrate
        fit` reports how far the roofline alone is from the measured card, the size of error to
        expect."""
        bw, fl = gpu.bandwidth_gbs / measured_on.bandwidth_gbs, gpu.fp16_tflops / measured_on.fp16_tflops

        def roof(m: int, spec: GPUSpec) -> float:
            return spec.floor_s(self.weight_bytes, m * self.flops_per_token)

        out = copy.deepcopy(self)
        out.p1 = dict(self.p1, fixed_s=self.p1["fixed_s"] * roof(1, gpu) / roof(1, measured_on),  # the weights' read
                      kv_gbs=self.p1["kv_gbs"] * bw, serial_s_per_token=self.p1["serial_s_per_token"] / bw)
        out.pd_rates = {k: {"kv_gbs": v["kv_gbs"] * bw, "serial_s_per_token": v["serial_s_per_token"] / bw}
                        for k, v in self.pd_rates.items()}
        out.graph_s = {b: t * roof(b, gpu) / roof(b, measured_on) for b, t in self.graph_s.items()}
        out.pp = dict(self.pp, weight_gbs=self.pp["weight_gbs"] * bw, matmul_tflops=self.pp["matmul_tflops"] * fl,
                      kv_gbs=self.pp["kv_gbs"] * bw, attention_tflops=self.pp["attention_tflops"] * fl,
                      serial_s_per_token=self.pp["serial_s_per_token"] / bw)
        out.gpu, out.free_gib, out.kv_blocks = f"{gpu.name} (projected from {self.gpu})", None, None
        return out

    @classmethod
    def from_json(cls, path: str | Path, model: str | None = None) -> "CalibratedCost":
        """Load a calibration file; `model`, when given, must be the model it was measured with."""
        path = Path(path)
        if path.is_dir():
            raise ValueError(f"cost model file {path} is a directory")
        try:
            text = path.read_text()
            d = json.loads(text, parse_constant=_refuse_constant)
        except FileNotFoundError:
            raise ValueError(f"cost model file {path} does not exist") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        except _NotANumber as e:
            raise ValueError(f"{path}, line {_line_of(text, e.args[0])}: {e.args[0]} is not a number a cost model "
                             "can use") from None
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            got = d.get("format") if isinstance(d, dict) else type(d).__name__
            raise ValueError(f"{path}: expected a calibration file with \"format\": \"{FORMAT}\", got {got!r}")
        for key in ("model", "constants", "parameters", "decode_attention"):
            if key not in d:
                raise ValueError(f"{path}: missing {key!r}")
        if model is not None and d["model"] != model:
            raise ValueError(f"{path} is a cost model for {d['model']!r}, but this run simulates {model!r}; "
                             f"calibrate for {model!r} or pass --model {d['model']}")
        try:
            return cls(d, str(path))
        except KeyError as e:
            raise ValueError(f"{path}: missing {e}") from None
        except (TypeError, AttributeError) as e:
            raise ValueError(f"{path}: not the shape of a calibration file ({e})") from None


class _NotANumber(ValueError):
    """NaN or Infinity in a calibration file (JSON has neither; Python writes them)."""


def _refuse_constant(name: str):
    raise _NotANumber(name)


def _line_of(text: str, name: str) -> int:
    """The line of the first `name` written as a bare JSON value."""
    found = re.search(r"[:\[,]\s*" + re.escape(name), text)
    return text.count("\n", 0, found.end()) + 1 if found else 1
