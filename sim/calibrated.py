"""The continuous engine's measured pass time: the cost model `calibrate fit` writes and the
simulator reads (`--cost calibrated:h200`, or a file in the format "llm-sim-cost/v3").

A pass falls in one of three regimes, as the engine runs it:

- `decode1`: one sequence decoding (the fused batch-1 kernels, one CUDA graph);
- `decode`: every sequence decoding (a CUDA graph at the padded batch B = `bucket(S)`, S itself
  past the largest bucket, launched kernel by kernel);
- `prefill`: anything else: prompts, chunks, mixed passes (a graph at the token count padded to
  a power of two up to 8,192, kernel by kernel beyond).

Its time, S sequences, sequence i putting n_i tokens through on top of c_i cached ones:

    decode1:  fixed_s + kv + serial
    decode:   graph_s[B] + decode_attention + S * per_seq_s
    prefill:  fixed_s + max(weights, projections) + chunk_attention + S * per_seq_s

    weights     = weight_bytes / weight_gbs             (the weight read a pass does once)
    projections = M * flops_per_token / matmul_tflops   (M: the tokens, padded to the graph's)
    kv          = sum(c_i + n_i) * kv_bytes_per_token / kv_gbs
    serial      = slice * serial_s_per_token            (batch 1: slice, the positions of the longest
                                                        slice of its c + 1, as the decode slicing cuts it)

`graph_s` holds, per decode bucket, the time of the graph itself (weights, projections, the
programs launched for padding rows, everything not attention's work): a measured table, for
cuBLAS's time does not follow B smoothly.

Decode attention (`decode_waves`). The kernel's grid is (B, kv_heads, slices): every program
takes one slice of one sequence's context for one KV head. Slicing by the padded batch B the
graph was captured at (what the engine launches): `slicing[B * kv_heads >= fills_gpu]` gives
(slices, shortest); a context of L positions (the new token's included) is cut into slices of
sl(L) = max(ceil(ceil(L / slices) / block_n) * block_n, shortest) positions, live(L) =
ceil(L / sl(L)) of them (programs past the last exit at once: their cost is the graph's).
From the batch's mean length Lbar = ceil(sum c_i / S) + 1 and longest Lm = max c_i + 1 (closed
form: no loop over programs):

    P       = kv_heads * S * live(Lbar)                    live programs
    blk     = ceil(min(sl(Lbar), Lbar) / block_n)          blocks a program walks
    waves   = ceil(P / wave), wave = sms * decode_programs_per_sm programs resident at once
    a wave  = max((blk + 1) * block_s, programs_in_it * blk * block_bytes / kv_gbs)
    decode_attention = max(sum of the waves, (crit + 1) * block_s) + live(Lm) * merge_s
                       + P * program_s

a wave lasts as long as its longest program's walk (a latency, block_s a block, one block's
worth for starting) or its programs' reads at the KV bandwidth, whichever is longer (block_bytes:
one KV head's K and V of block_n positions over every layer); crit = ceil(min(sl(Lm), Lm) /
block_n), the longest context's slice, can outlast the waves; the last slice of the longest
context merges its live(Lm) partials (merge_s each). `block_s`, `merge_s`, `program_s` and
`kv_gbs` have a value for small batches (the first slicing) and one for batches that fill the GPU.

Chunk attention (`chunk_waves`), prefill and mixed passes: the kernel's programs are tiles of
`tile_tokens` query tokens of one sequence and one KV head, sequence i has t_i = ceil(n_i /
tile_tokens) tiles per KV head, its k-th from the last reading ceil((c_i + min(k *
tile_tokens, n_i)) / block_n) blocks:

    P      = kv_heads * sum t_i                     programs
    work   = kv_heads * sum (t_i c_i + tile_tokens t_i (t_i - 1) / 2 + n_i) / block_n + P / 2
    crit   = ceil(max(c_i + n_i) / block_n)         the longest tile's blocks
    waves  = ceil(P / (sms * prefill_programs_per_sm))
    chunk_attention = max(crit * block_s + program_s, waves * ((work / P) * block_s + program_s),
                          kv * kv_bytes_per_token / kv_gbs)

its programs run in waves of the SMs' resident programs, each wave as long as a mean program
(the tiles of one sequence run longest first, so a list schedule's waves are near even), never
shorter than the longest tile nor than reading the KV cache once.
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

FORMAT = "llm-sim-cost/v3"
ALWAYS = 1 << 62
# Bounds on a file's numbers, so that no pass takes longer than the longest trace (or forever):
# times at most MAX_ARRIVAL_S (1e8 s), a rate 0 (its term off) or at least MIN_RATE per second.
MIN_RATE = 1e-6
UNITS = {"fixed_s": "s", "graph_s": "s", "per_seq_s": "s", "serial_s_per_token": "s", "block_s": "s",
         "merge_s": "s", "program_s": "s", "weight_gbs": "GB/s", "kv_gbs": "GB/s", "matmul_tflops": "TFLOP/s"}
DECODE1 = ("fixed_s", "kv_gbs", "serial_s_per_token")
DECODE_ATTENTION = ("kv_gbs", "block_s", "merge_s", "program_s")
PREFILL = ("fixed_s", "weight_gbs", "matmul_tflops", "kv_gbs", "block_s", "program_s", "per_seq_s")
WAVES = ("sms", "decode_programs_per_sm", "prefill_programs_per_sm")


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
        a = d["decode_attention"]
        self.kv_heads, self.fills_gpu, self.block_n = (self._whole(a[k], f"decode_attention.{k}")
                                                       for k in ("kv_heads", "fills_gpu", "block_n"))
        self.slicing = {big: self._slicing(a[part], f"decode_attention.{part}")
                        for big, part in ((False, "small"), (True, "big"))}
        self.tile_tokens = self._whole(d["chunk_attention"]["tile_tokens"], "chunk_attention.tile_tokens")
        w = d["waves"]
        self.sms, per_decode, per_prefill = (self._whole(w[k], f"waves.{k}") for k in WAVES)
        self.decode_wave, self.prefill_wave = self.sms * per_decode, self.sms * per_prefill
        self.block_bytes = self.kv_bytes * self.block_n / self.kv_heads  # one KV head's block, every layer
        p = d["parameters"]
        self.p1 = self._values(p, "decode1", DECODE1)
        self.pd = self._values(p, "decode", ("per_seq_s",))
        self.pd_rates = {big: self._values(p["decode"], part, DECODE_ATTENTION, f"decode.{part}")
                         for big, part in ((False, "small"), (True, "big"))}
        graph = p["decode"].get("graph_s")
        if not isinstance(graph, dict) or not graph:
            raise ValueError(f"{source}: parameters.decode.graph_s must map decode buckets to seconds")
        self.graph_s = {self._whole(k, "parameters.decode.graph_s"): self._number(v, f"decode.graph_s.{k}")
                        for k, v in graph.items()}
        self.pp = self._values(p, "prefill", PREFILL)
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
        """Positions the longest decode-attention slice of a context of `length` walks, `batch`
        sequences launched (batch 1's critical path)."""
        return min(self._slice(length, batch * self.kv_heads >= self.fills_gpu)[0], length)

    def _slice(self, length: int, big: bool) -> tuple[int, int]:
        """(positions a slice, live slices) of a context of `length` positions (module docstring)."""
        slices, shortest = self.slicing[big]
        sl = max(-(-(-(-length // slices)) // self.block_n) * self.block_n, shortest)
        return sl, -(-length // sl)

    def decode_waves(self, S: int, context_sum: int, context_max: int) -> tuple:
        """A decode pass's attention, as the module docstring says: the padded batch B, big, and
        the arguments of `decode_attention`."""
        B = bucket(S, self.buckets)
        big = B * self.kv_heads >= self.fills_gpu
        mean, longest = -(-context_sum // S) + 1, context_max + 1
        bn, C = self.block_n, self.decode_wave
        sl, live = self._slice(mean, big)
        slm, live_m = self._slice(longest, big)
        blk = -(-min(sl, mean) // bn)                   # a full slice's blocks
        tail = -(-(mean - (live - 1) * sl) // bn)       # the last slice's
        n1, n2 = self.kv_heads * S * (live - 1), self.kv_heads * S
        full1, r = divmod(n1, C)
        k = min(C - r, n2) if r else 0                  # last slices in the wave the full ones leave
        full2, rem2 = divmod(n2 - k, C)
        return B, big, n1 + n2, blk, tail, full1, r, k, full2, rem2, -(-min(slm, longest) // bn), live_m

    def decode_attention(self, big: bool, P: int, blk: int, tail: int, full1: int, r: int, k: int, full2: int,
                         rem2: int, crit: int, merges: int) -> float:
        rates = self.pd_rates[big]
        tb, C = rates["block_s"], self.decode_wave
        rb = self.block_bytes / (rates["kv_gbs"] * 1e9) if rates["kv_gbs"] else 0.0  # a block's read
        lat1, lat2 = (blk + 1) * tb, (tail + 1) * tb
        waves = (full1 * max(lat1, C * blk * rb) + (max(lat1, (r * blk + k * tail) * rb) if r else 0.0)
                 + full2 * max(lat2, C * tail * rb) + (max(lat2, rem2 * tail * rb) if rem2 else 0.0))
        return max(waves, (crit + 1) * tb) + merges * rates["merge_s"] + P * rates["program_s"]

    def chunk_waves(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> tuple:
        """A prefill or mixed pass's chunk attention, as the module docstring says: (KV positions
        read, programs P, blocks they walk, the longest tile's blocks, waves)."""
        T = self.tile_tokens
        kv = tiles = work = crit = 0
        for n, c in zip(new_tokens, context_lens):
            t = -(-n // T)
            kv += c + n
            tiles += t
            work += t * c + T * t * (t - 1) // 2 + n
            if c + n > crit:
                crit = c + n
        P = self.kv_heads * tiles
        return kv, P, self.kv_heads * work / self.block_n + P / 2, -(-crit // self.block_n), -(-P // self.prefill_wave)

    def chunk_attention(self, kv: int, P: int, work: float, crit: int, waves: int) -> float:
        p = self.pp
        return max(crit * p["block_s"] + p["program_s"], waves * (work / P * p["block_s"] + p["program_s"]),
                   self._rate(kv, self.kv_bytes, p["kv_gbs"], 1e9))

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
        if r == "decode1":
            return self._decode1(context_lens[0] + 1)
        if r == "decode":
            return self._decode(S, sum(context_lens), max(context_lens))
        p = self.pp
        m = bucket(sum(new_tokens), self.token_buckets)
        weights = self._rate(self.weight_bytes, 1.0, p["weight_gbs"], 1e9)
        projections = self._rate(m, self.flops_per_token, p["matmul_tflops"], 1e12)
        return (p["fixed_s"] + max(weights, projections) + self.chunk_attention(*self.chunk_waves(new_tokens, context_lens))
                + S * p["per_seq_s"])

    def _decode1(self, length: int) -> float:
        p = self.p1
        return (p["fixed_s"] + self._rate(length, self.kv_bytes, p["kv_gbs"], 1e9)
                + self.slice_positions(length, 1) * p["serial_s_per_token"])

    def _decode(self, S: int, context_sum: int, context_max: int) -> float:
        B, *shape = self.decode_waves(S, context_sum, context_max)
        return self.graph_time(B) + self.decode_attention(*shape) + S * self.pd["per_seq_s"]

    def predict_all(self, passes) -> list[float]:
        """pass_time of every PassRecord."""
        return [self.pass_time(p.new_tokens, p.context_lens) for p in passes]

    def decode_line(self, batch_size: int, context_sum: int, context_max: int | None = None) -> tuple[float, float, int]:
        """Pass j of a run of decode passes (every context one longer each pass) takes a + b*j,
        for j < valid: valid ends where a term's step (a whole block, a slice more) next comes."""
        S = batch_size
        L = (context_max if context_max is not None else context_sum // S) + 1
        if S == 1:  # kv grows by a position a pass; the critical slice until its length next changes
            slices, shortest = self.slicing[self.kv_heads >= self.fills_gpu]
            if L < shortest:  # the whole context is one short slice: it grows with the context
                valid = shortest - L
            else:
                valid = slices * self.slice_positions(L, 1) - L + 1
            a = self._decode1(L)
            return a, self._decode1(L + 1) - a, max(1, valid)
        # decode: every term is a function of ceil(length / block_n) and ceil(length / shortest) of
        # the mean and the longest length (both one longer each pass): constant until either steps
        shortest = self.slicing[bucket(S, self.buckets) * self.kv_heads >= self.fills_gpu][1]
        mean = -(-context_sum // S) + 1
        valid = min(-(-x // q) * q + 1 - x for x in (L, mean) for q in (self.block_n, max(shortest, 1)))
        return self._decode(S, context_sum, L - 1), 0.0, max(1, valid)

    # ------------------------------------------------------------------ elsewhere

    def projected(self, gpu: GPUSpec, measured_on: GPUSpec) -> "CalibratedCost":
        """This model moved to another GPU: bandwidth terms (weights, KV, decode attention's walk
        through the cache and its merges) by the ratio of the cards' bandwidths, arithmetic
        (projections, chunk attention's blocks) by their arithmetic rates, each decode graph's
        time (and batch 1's fixed time, which is mostly the weights' read) by the ratio of the
        roofline's time for its batch on the two cards; the other fixed costs (per program, per
        sequence) and the waves' shape (the measured card's SMs) stay. A projection, not a
        measurement: `calibrate fit` reports how far the roofline alone is from the measured
        card, the size of error to expect."""
        bw, fl = gpu.bandwidth_gbs / measured_on.bandwidth_gbs, gpu.fp16_tflops / measured_on.fp16_tflops

        def roof(m: int, spec: GPUSpec) -> float:
            return spec.floor_s(self.weight_bytes, m * self.flops_per_token)

        out = copy.deepcopy(self)
        out.p1 = dict(self.p1, fixed_s=self.p1["fixed_s"] * roof(1, gpu) / roof(1, measured_on),  # the weights' read
                      kv_gbs=self.p1["kv_gbs"] * bw, serial_s_per_token=self.p1["serial_s_per_token"] / bw)
        out.pd_rates = {k: dict(v, kv_gbs=v["kv_gbs"] * bw, block_s=v["block_s"] / bw, merge_s=v["merge_s"] / bw)
                        for k, v in self.pd_rates.items()}
        out.graph_s = {b: t * roof(b, gpu) / roof(b, measured_on) for b, t in self.graph_s.items()}
        out.pp = dict(self.pp, weight_gbs=self.pp["weight_gbs"] * bw, matmul_tflops=self.pp["matmul_tflops"] * fl,
                      kv_gbs=self.pp["kv_gbs"] * bw, block_s=self.pp["block_s"] / fl)
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
        for key in ("model", "constants", "parameters", "decode_attention", "chunk_attention", "waves"):
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
