"""The continuous engine's measured pass time: the cost model `calibrate fit` writes and the
simulator reads (`--cost calibrated:h200`, or a file in the format "llm-sim-cost/v5").

A pass falls in one of three regimes, as the engine runs it:

- `decode1`: one sequence decoding (the fused batch-1 kernels, one CUDA graph);
- `decode`: every sequence decoding (a CUDA graph at the padded batch B = `bucket(S)`, S itself
  past the largest bucket, launched kernel by kernel);
- `prefill`: anything else: prompts, chunks, mixed passes (a graph at the token count padded to
  a power of two up to the largest token bucket, 8,192; kernel by kernel beyond: `eager`).

Its time, S sequences, sequence i putting n_i tokens through on top of c_i cached ones:

    decode1:  fixed_s + blocks(L) * block_n * serial_s_per_token + live(L) * merge_s
    decode:   graph_s[B] + decode_attention
    prefill:  fixed_s + max(weights, projections) + chunk_attention + S * per_seq_s (+ eager_s)

(max(weights, projections) is their k-norm, (weights^k + projections^k)^(1/k), where the file's
`prefill.smooth` = k is above 0, from their sum at k = 1 towards their max as k grows:
`smoothed`; 0 or absent, the max.)

    weights     = weight_bytes / weight_gbs             (the weight read a pass does once)
    projections = M * flops_per_token / matmul_tflops   (M: the tokens, padded to the graph's)

`graph_s` holds, per decode bucket, the time of the graph itself (weights, projections, the
programs launched for padding rows, everything not attention's work): a measured table, for
cuBLAS's time does not follow B smoothly. `eager_s` is what a prefill pass past the largest
token bucket pays for launching its kernels one by one.

Decode attention's slices. The kernel's grid is (B, kv_heads, slices): every program takes one
slice of one sequence's context for one KV head; slices past a context's end exit at once (their
cost is the graph's). By the padded batch B the graph was captured at (what the engine
launches), `core.slicing.decode_slicing(B * kv_heads, small, big, fills_gpu, programs)` gives
(slices, shortest) (`slicing_at`; "programs" is optional: files before it gave every batch under
`fills_gpu` pairs the small slicing's slices), and a context of L
positions (the new token's included) is cut into slices of sl(L) = max(ceil(ceil(L / slices) /
block_n) * block_n, shortest) positions (`slice_of`). The engine walks whole slices and whole
blocks; the model takes their counts as expected over a context's offset into its last slice or
block, so that a run of decode passes (every context one longer each pass) is piecewise linear,
with kinks hundreds to thousands of positions apart:

    work(L)   = max(1, L / sl)             full slices' worth of programs
    live(L)   = max(1, L / sl + 1/2)       slices merged (the last one partial)
    blocks(L) = min(sl, L + block_n / 2) / block_n      blocks a full slice walks

Batch 1's time is its longest slice's walk (serial_s_per_token a position) and the merge of its
live slices by the last one to finish (merge_s each): a lone sequence's few programs are
latency-bound, far from the KV bandwidth. A batch's (`decode_attention`), from its mean length
Lbar = ceil(sum c_i / S) + 1 and its longest Lm = max c_i + 1 (closed form, no loop over
sequences):

    P       = kv_heads * S * work(Lbar)                 programs, in full slices
    C       = sms * decode_programs_per_sm              programs resident at once (a wave)
    full, rest = P // C, P - full * C                   full waves, the last wave's programs
    lat     = (blocks(Lbar) + 1) * block_s              a wave's longest walk (a block to start)
    waves   = full * max(lat, C * blocks * block_bytes / kv_gbs)
              + lat + tail * rest * blocks * block_bytes / kv_gbs    (if rest > 0)
    decode_attention = max(waves, (blocks(Lm) + 1) * block_s) + live(Lm) * merge_s + P * program_s
                       + max(0, B - spread_from) * (live(Lm) - live(Lbar)) * spread_s

a full wave lasts as long as its longest program's walk or its programs' reads at the KV
bandwidth, whichever is longer (block_bytes: one KV head's K and V of block_n positions over
every layer); the last, partial wave (the only one when P < C) a walk and its reads at `tail`
times their time at the bandwidth: neither bound alone holds there (the sweep at f3d1ca4: 16
programs past a full wave of 2,048-position slices add 0.6 ms, a walk; 496 add 1.6 ms, a walk and
about three quarters of their reads' time; a fitted `max` of the two missed the partial waves by
up to 10%). The longest context's slice can outlast the waves; its live slices are merged by the
last. The grid launches slice by slice (every row's slice 0, then every row's slice 1, ...), so
the longest context's last slices start only once the launches of every row's earlier slices
have gone by: a batch of spread contexts pays for the rows it launches beyond its mean's live
slices (`spread_s` a row and slice, past the first `spread_from` rows; fitted apart, on decode
batches of spread contexts beside their twins of one context, by `python -m calibrate fit
--spread`: `calibrate.mixtures`; 0, the term off, in a file without them, as in the committed
H200 calibration: ../results/calibration/README.md says why). `block_s`, `merge_s`, `program_s`,
`kv_gbs`, `tail` and `spread_s` have a value for small batches (the first slicing) and one for
batches that fill the GPU.

A file may instead price the decode attention of batches that fill the GPU by its programs'
schedule (`parameters.decode.schedule`: `kv_gbs`, `block_s`, `start_s`; `sim.schedule`): the big
slicing's programs of every sequence, in launch order over `decode_wave` resident, sharing
`kv_gbs`, each no faster than a block (every layer's) per `block_s`, a start costing `start_s`:

    decode (B * kv_heads >= fills_gpu) = graph_s[B] + makespan(the pass's programs)

priced pass by pass (its steps follow every sequence's blocks, so `decode_line` gives no line
for such batches and the simulator steps them). `python -m calibrate fit --schedule` fits it.

Chunk attention (`chunk_waves`), prefill and mixed passes: the kernel's programs are tiles of
`tile_tokens` query tokens of one sequence and one KV head, sequence i has t_i = ceil(n_i /
tile_tokens) tiles per KV head, its k-th from the last reading ceil((c_i + min(k *
tile_tokens, n_i)) / block_n) blocks:

    P      = kv_heads * sum t_i                     programs
    work   = kv_heads * sum (t_i c_i + tile_tokens t_i (t_i - 1) / 2 + n_i) / block_n + P / 2
    crit   = ceil(max(c_i + n_i) / block_n)         the longest tile's blocks
    waves  = ceil(P / (sms * prefill_programs_per_sm))
    mean   = (work / P) * block_s + program_s       a mean tile (program_s: a tile's own cost)
    chunk_attention = max(crit * block_s + program_s, waves * mean * (shared if waves > 1 else 1))

its programs run in waves of the SMs' resident programs, each wave as long as a mean tile (the
tiles of one sequence run longest first, so a list schedule's waves are near even), never
shorter than the longest tile; past the first wave, waves overlap (a tile starts as another
ends, no barrier between them): `shared`, fitted, is the share of a lone wave's time each takes.

A file may instead price mixed passes (decodes beside prompt tokens, run as a CUDA graph) by
their chunk attention's tiles list-scheduled (`parameters.mixed`: `fixed_s`, `weight_gbs`,
`matmul_tflops`, `per_seq_s`, `block_s`, `start_s`; `sim.schedule.chunk_tile_runs`): in a graph
every row goes through the chunk-attention kernel, a decode a tile of its own walking its whole
context, and the tiles of a mixed pass (a chunk's short and long ones, 100-250 decodes of
served contexts) are too uneven for the waves of a mean tile:

    mixed = fixed_s + max(weights, projections) + block_s * makespan(tiles) + S * per_seq_s

the tiles in launch order over `prefill_wave` resident, each taking (blocks + start_s / block_s)
block times, the next starting as one ends. `python -m calibrate fit --mixed` fits it on the
sweep's prompt and mixed passes run as graphs (a form of its own, beside the waves').

Two optional fields are not a pass's own cost and are applied by the simulator's replica:
"host" (`sim.host`: the engine's host time around passes it plans on an idle GPU, and when the
next plan sees arrivals) and "heat" (`sim.heat`: how much recent prompt work slows a pass).
A third, "range", holds the largest shapes the sweep timed (tokens in a pass, sequences in a
decode pass, positions of a sequence): the model prices passes beyond them as well, by the same
formulas, and counts them (`extrapolated`, `extrapolation()`), so that a run can say its figures
rest on extrapolation.
"""
from __future__ import annotations

import copy
import json
import math
from bisect import bisect_left
from dataclasses import replace
from importlib import resources
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from core.config import ModelConfig
from core.records import pass_kind
from core.roofline import GIB, GPUSpec
from core.slicing import decode_slicing
from sim.heat import Heat
from sim.host import HostTime
from sim.noise import Noise
from sim.schedule import chunk_tile_runs, makespan, program_runs
from traces.trace import MAX_ARRIVAL_S

FORMAT = "llm-sim-cost/v5"
# A decode line's longest run: its slope, the difference of two passes' times, carries their
# rounding (~1e-16 of a pass), which j passes later is j times larger: under 1e-12 of a pass here.
LINE_MAX = 1024
LINE_CHECK = 1e-6  # relative: a decode line's prediction at its last pass against the model's own
ALWAYS = 1 << 62
# Bounds on a file's numbers, so that no pass takes longer than the longest trace (or forever):
# times at most MAX_ARRIVAL_S (1e8 s), a rate 0 (its term off) or at least MIN_RATE per second.
MIN_RATE = 1e-6
UNITS = {"fixed_s": "s", "graph_s": "s", "eager_s": "s", "per_seq_s": "s", "serial_s_per_token": "s", "block_s": "s",
         "merge_s": "s", "program_s": "s", "spread_s": "s", "weight_gbs": "GB/s", "kv_gbs": "GB/s",
         "matmul_tflops": "TFLOP/s",
         "shared": "x", "tail": "x", "smooth": "x"}
DECODE1 = ("fixed_s", "serial_s_per_token", "merge_s")
DECODE_ATTENTION = ("kv_gbs", "block_s", "merge_s", "program_s", "tail", "spread_s")
PREFILL = ("fixed_s", "weight_gbs", "matmul_tflops", "eager_s", "block_s", "program_s", "shared", "per_seq_s",
           "smooth")
WAVES = ("sms", "decode_programs_per_sm", "prefill_programs_per_sm")
SCHEDULE = ("kv_gbs", "block_s", "start_s")  # decode attention of batches that fill the GPU, as scheduled
MIXED = ("fixed_s", "weight_gbs", "matmul_tflops", "per_seq_s", "block_s", "start_s")  # mixed passes, tiles listed
RANGE = ("pass_tokens", "decode_batch", "context")  # the sweep's largest shapes (`calibrate.fit.sweep_range`)


def bucket(n: int, buckets: Sequence[int]) -> int:
    """The padded size a CUDA graph runs n rows at: the smallest bucket (of the sorted `buckets`)
    that holds them (n itself past the largest bucket, run without a graph)."""
    i = bisect_left(buckets, n)
    return buckets[i] if i < len(buckets) else n


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
        self.programs = None if a.get("programs") is None else self._whole(a["programs"], "decode_attention.programs")
        self.tile_tokens = self._whole(d["chunk_attention"]["tile_tokens"], "chunk_attention.tile_tokens")
        w = d["waves"]
        self.sms, per_decode, per_prefill = (self._whole(w[k], f"waves.{k}") for k in WAVES)
        self.decode_wave, self.prefill_wave = self.sms * per_decode, self.sms * per_prefill
        self.block_bytes = self.kv_bytes * self.block_n / self.kv_heads  # one KV head's block, every layer
        p = d["parameters"]
        self.p1 = self._values(p, "decode1", DECODE1)
        self.pd_rates = {big: self._values(p["decode"], part, DECODE_ATTENTION, f"decode.{part}")
                         for big, part in ((False, "small"), (True, "big"))}
        graph = p["decode"].get("graph_s")
        if not isinstance(graph, dict) or not graph:
            raise ValueError(f"{source}: parameters.decode.graph_s must map decode buckets to seconds")
        self.graph_s = {self._whole(k, "parameters.decode.graph_s"): self._number(v, f"decode.graph_s.{k}")
                        for k, v in graph.items()}
        self.spread_from = self._number(p["decode"].get("spread_from", 0.0), "decode.spread_from")
        # optional: batches that fill the GPU priced by their programs' schedule (sim.schedule)
        schedule = p["decode"].get("schedule")
        if schedule is not None and not isinstance(schedule, dict):
            raise ValueError(f"{source}: parameters.decode.schedule must be an object with {list(SCHEDULE)}")
        self.schedule = {k: self._number(schedule.get(k, 0.0), f"decode.schedule.{k}") for k in SCHEDULE} \
            if schedule is not None else None
        if self.schedule and not (self.schedule["kv_gbs"] and self.schedule["block_s"]):
            raise ValueError(f"{source}: parameters.decode.schedule needs kv_gbs and block_s above 0")
        self.pp = self._values(p, "prefill", PREFILL)
        # optional: mixed passes priced by the chunk kernel's tiles list-scheduled (sim.schedule)
        self.mixed = self._values(p, "mixed", MIXED) if p.get("mixed") is not None else None
        if self.mixed and not self.mixed["block_s"]:
            raise ValueError(f"{source}: parameters.mixed.block_s must be above 0")
        # optional: the largest shapes the sweep timed; passes priced beyond them are counted
        self.range = {k: self._whole(v, f"range.{k}") for k, v in (d.get("range") or {}).items() if k in RANGE}
        self.extrapolated: dict[str, list[int]] = {}  # limit -> [passes beyond it, the largest value]
        self.host = HostTime.from_dict(d.get("host"), source)  # optional: the engine's host time (sim.host)
        self.heat = Heat.from_dict(d.get("heat"), source)  # optional: decode slowed by recent prompt work (sim.heat)
        self.noise = Noise.from_dict(d.get("noise"), source)  # optional: the engine's scatter (sim.noise, --noise)
        self.projected_from: str | None = None  # the model it was measured on, when projected to another

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
        return {k: self._number(part.get(k, 1.0 if k == "shared" else 0.0), f"{where or name}.{k}") for k in keys}

    # ------------------------------------------------------------------ the terms

    def slicing_at(self, B: int) -> tuple[int, int]:
        """(slices, shortest) of a decode launch at padded batch B (the module docstring)."""
        return decode_slicing(B * self.kv_heads, self.slicing[False], self.slicing[True], self.fills_gpu,
                              self.programs)

    def slice_of(self, length: int, B: int) -> tuple[int, float, float, float]:
        """(positions a slice sl, full slices' worth of work, live slices, blocks a full slice
        walks) of a context of `length` positions: work = max(1, length / sl), live = max(1,
        length / sl + 1/2) and blocks = min(sl, length + block_n / 2) / block_n, the whole slices
        and blocks the engine walks (ceil) as expected over the context's offsets (module docstring)."""
        sl, bn = self._slice_len(length, B), self.block_n
        return sl, max(1.0, length / sl), max(1.0, length / sl + 0.5), min(sl, length + bn / 2) / bn

    def _slice_len(self, length: int, B: int) -> int:
        """Positions a slice of a context of `length` positions at padded batch B: its share of the
        slicing's slices, in whole blocks, at least the shortest slice."""
        slices, shortest = self.slicing_at(B)
        bn = self.block_n
        return max(-(-(-(-length // slices)) // bn) * bn, shortest)

    def slice_lens(self, lengths: np.ndarray, B: int) -> np.ndarray:
        """`slice_of`'s positions a slice, for an array of context lengths at once."""
        slices, shortest = self.slicing_at(B)
        bn = self.block_n
        return np.maximum(-(-(-(-lengths // slices)) // bn) * bn, shortest)

    def _region_end(self, length: int, B: int) -> int:
        """Passes from a context of `length` positions (one longer each pass) to the next kink of
        `slice_of` (live slices grow from sl / 2, work from sl, blocks stop at sl - block_n / 2) or
        step (the slice length grows past slices * sl positions)."""
        return _region_end(length, self._slice_len(length, B), self.slicing_at(B)[0], self.block_n)

    def decode_shape(self, S: int, context_sum: int, context_max: int) -> tuple:
        """A decode pass's attention, as the module docstring says: (padded batch B, big, programs P
        in full slices' worth, blocks a full slice walks, the longest slice's blocks, slices merged,
        the grid's rows past `spread_from` times the longest's live slices beyond the mean's)."""
        B = bucket(S, self.buckets)
        big = B * self.kv_heads >= self.fills_gpu
        mean, longest = -(-context_sum // S) + 1, context_max + 1
        _, work, live_b, blk = self.slice_of(mean, B)
        _, _, live_m, crit = self.slice_of(longest, B)
        return B, big, self.kv_heads * S * work, blk, crit, live_m, self.spread_rows(B) * (live_m - live_b)

    def spread_slices(self, S: int, context_sum: int, context_max: int) -> float:
        """live(Lm) - live(Lbar) of a decode pass (`decode_shape`): the spread term's slices."""
        B = bucket(S, self.buckets)
        return self.slice_of(context_max + 1, B)[2] - self.slice_of(-(-context_sum // S) + 1, B)[2]

    def spread_rows(self, B: int) -> float:
        """The rows of a decode grid of padded batch B whose slices delay the longest sequence's last
        ones (module docstring): those past `spread_from`."""
        return B - self.spread_from if B > self.spread_from else 0.0

    def decode_attention(self, big: bool, P: float, blk: float, crit: float, merges: float, spread: float) -> float:
        return _attention(self._attention_parts(big, P, blk, crit, merges, spread))

    def _attention_parts(self, big: bool, P: float, blk: float, crit: float, merges: float, spread: float) -> tuple:
        """decode_attention's pieces: full waves, a wave's latency, a full wave's read, the last
        wave's read (at `tail` times the bandwidth's time), its programs, the longest slice's
        latency, the merges', programs' and spread's time."""
        rates = self.pd_rates[big]
        tb, C = rates["block_s"], self.decode_wave
        rb = self.block_bytes / (rates["kv_gbs"] * 1e9) if rates["kv_gbs"] else 0.0  # a block's read
        full = math.floor(P / C)
        rest = P - full * C
        return (full, (blk + 1) * tb, C * blk * rb, rates["tail"] * rest * blk * rb, rest, (crit + 1) * tb,
                merges * rates["merge_s"] + P * rates["program_s"] + spread * rates["spread_s"])

    def chunk_waves(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> tuple:
        """A prefill or mixed pass's chunk attention, as the module docstring says: (programs P,
        blocks they walk, the longest tile's blocks, waves)."""
        T = self.tile_tokens
        tiles = work = crit = 0
        for n, c in zip(new_tokens, context_lens):
            t = -(-n // T)
            tiles += t
            work += t * c + T * t * (t - 1) // 2 + n
            if c + n > crit:
                crit = c + n
        P = self.kv_heads * tiles
        return P, self.kv_heads * work / self.block_n + P / 2, -(-crit // self.block_n), -(-P // self.prefill_wave)

    def chunk_attention(self, P: int, work: float, crit: int, waves: int) -> float:
        p = self.pp
        mean = work / P * p["block_s"] + p["program_s"]
        return max(crit * p["block_s"] + p["program_s"], waves * mean * (p["shared"] if waves > 1 else 1.0))

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

    def _beyond(self, limit: str, value: int) -> None:
        """Count a pass priced past the sweep's largest `limit` (a dict lookup when within)."""
        if value > self.range.get(limit, value):
            seen = self.extrapolated.setdefault(limit, [0, 0])
            seen[0] += 1
            seen[1] = max(seen[1], value)

    def extrapolation(self) -> str | None:
        """What was priced beyond the sweep's shapes since `extrapolated` was last cleared (each
        simulation clears it as it starts), in a sentence (None: nothing)."""
        if not self.extrapolated:
            return None
        names = {"pass_tokens": "tokens in a pass", "decode_batch": "sequences in a decode pass",
                 "context": "positions of a sequence"}
        return "; ".join(f"{n:,} pass{'' if n == 1 else 'es'} beyond the calibration sweep's {self.range[k]:,} "
                         f"{names[k]} (up to {top:,})" for k, (n, top) in self.extrapolated.items()) + \
            ": their times are extrapolated"

    def pass_time(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float:
        r = regime(new_tokens)
        S = len(new_tokens)
        if r == "decode1":
            self._beyond("context", context_lens[0] + 1)
            return self._decode1(context_lens[0] + 1)
        if r == "decode":
            longest = max(context_lens)
            self._beyond("decode_batch", S)
            self._beyond("context", longest + 1)
            if self.schedule is not None and self.fills(S):
                return self.graph_time(bucket(S, self.buckets)) + self.scheduled_attention(context_lens)
            return self._decode(S, sum(context_lens), longest)
        p = self.pp
        tokens = sum(new_tokens)
        self._beyond("pass_tokens", tokens)
        self._beyond("context", max(c + n for c, n in zip(context_lens, new_tokens)))
        m = bucket(tokens, self.token_buckets)
        if self.mixed is not None and not self.eager(m) and pass_kind(new_tokens, context_lens) == "mixed":
            return self.listed(m, new_tokens, context_lens, self.mixed)
        return (p["fixed_s"] + self.weights_or_projections(m, p)
                + self.chunk_attention(*self.chunk_waves(new_tokens, context_lens))
                + S * p["per_seq_s"] + (p["eager_s"] if self.eager(m) else 0.0))

    def weights_or_projections(self, m: int, rates: dict) -> float:
        """A pass of m tokens' (padded) weight read or its projections' arithmetic, whichever is
        longer, at `rates`' weight_gbs and matmul_tflops; with `rates["smooth"]` = k > 0, their
        k-norm (weights^k + projections^k)^(1/k) instead (`smoothed`)."""
        weights = self._rate(self.weight_bytes, 1.0, rates["weight_gbs"], 1e9)
        projections = self._rate(m, self.flops_per_token, rates["matmul_tflops"], 1e12)
        return smoothed(weights, projections, rates.get("smooth", 0.0))

    def listed(self, m: int, new_tokens: Sequence[int], context_lens: Sequence[int], q: dict) -> float:
        """A pass of m tokens (padded) priced with its chunk attention's tiles list-scheduled
        (`mixed`'s form, the rates `q`)."""
        return (q["fixed_s"] + self.weights_or_projections(m, q) + self.listed_attention(new_tokens, context_lens, q)
                + len(new_tokens) * q["per_seq_s"])

    def listed_attention(self, new_tokens: Sequence[int], context_lens: Sequence[int], q: dict) -> float:
        """Chunk attention as its tiles run: in launch order over `prefill_wave` resident, each
        (blocks * block_s + start_s) (`sim.schedule.makespan`, no bandwidth shared)."""
        runs = chunk_tile_runs(new_tokens, context_lens, self.tile_tokens, self.block_n, self.kv_heads)
        return q["block_s"] * makespan(runs, math.inf, 1.0, q["start_s"] / q["block_s"], self.prefill_wave)

    def fills(self, S: int) -> bool:
        """Whether a decode pass of S sequences fills the GPU: its padded batch gets the big slicing
        (and a file with "schedule" rates prices its attention by its programs' schedule)."""
        return bucket(S, self.buckets) * self.kv_heads >= self.fills_gpu

    def scheduled_runs(self, context_lens: Sequence[int]) -> list[tuple[int, int]]:
        """The programs of a decode pass that fills the GPU, in launch order as runs of (blocks, how
        many) (`sim.schedule.program_runs`, the big slicing's slices)."""
        lengths = np.asarray(context_lens, dtype=np.int64) + 1
        return program_runs(lengths, self.slice_lens(lengths, bucket(len(lengths), self.buckets)), self.block_n,
                            self.kv_heads)

    def scheduled_time(self, runs: Sequence[tuple[int, int]], rates: dict) -> float:
        """Seconds the programs `runs` take at the schedule's `rates` (kv_gbs, block_s, start_s),
        `decode_wave` resident (`sim.schedule.makespan`)."""
        return makespan(runs, rates["kv_gbs"] * 1e9 / self.block_bytes, rates["block_s"], rates["start_s"],
                        self.decode_wave)

    def scheduled_attention(self, context_lens: Sequence[int]) -> float:
        """Decode attention of a batch that fills the GPU as its programs run (`sim.schedule`)."""
        return self.scheduled_time(self.scheduled_runs(context_lens), self.schedule)

    def eager(self, m: int) -> bool:
        """A prefill pass of m tokens (padded) runs without a CUDA graph: past the largest token bucket."""
        return not self.token_buckets or m > self.token_buckets[-1]

    def _decode1(self, length: int) -> float:
        p = self.p1
        _, _, live, blk = self.slice_of(length, 1)
        return p["fixed_s"] + blk * self.block_n * p["serial_s_per_token"] + live * p["merge_s"]

    def _decode(self, S: int, context_sum: int, context_max: int) -> float:
        B, *shape = self.decode_shape(S, context_sum, context_max)
        return self.graph_time(B) + self.decode_attention(*shape)

    def predict_all(self, passes) -> list[float]:
        """pass_time of every PassRecord."""
        return [self.pass_time(p.new_tokens, p.context_lens) for p in passes]

    def decode_line(self, batch_size: int, context_sum: int,
                    context_max: int | None = None) -> tuple[float, float, int] | None:
        """Pass j of a run of decode passes (every context one longer each pass) takes a + b*j,
        for j < valid: every term is linear in the mean and the longest length between kinks of
        `slice_of` (`_region_end`: hundreds to thousands of positions apart), so the line runs
        to the first of that region's end, the next step of the full waves (P grows by
        kv_heads * S / sl a pass) and the next change of a max()'s argument (the crossing of
        two lines), at most LINE_MAX passes. None for batches a file's "schedule" prices."""
        S = batch_size
        if self.schedule is not None and self.fills(S):
            return None  # priced by each pass's own programs (`scheduled_attention`): stepped pass by pass
        self._beyond("decode_batch", S)  # (the run's first pass: its contexts grow from there)
        self._beyond("context", (context_max if context_max is not None else context_sum // S) + 1)
        if S == 1:  # linear in its region
            L = (context_max if context_max is not None else context_sum) + 1
            valid = self._region_end(L, 1)
            a = self._decode1(L)
            return a, self._decode1(L + 1) - a, max(1, min(valid, LINE_MAX))
        longest = context_max if context_max is not None else context_sum // S
        B = bucket(S, self.buckets)
        big = B * self.kv_heads >= self.fills_gpu
        mean, L = -(-context_sum // S) + 1, longest + 1
        slices, shortest = self.slicing_at(B)
        bn = self.block_n
        sl = max(-(-(-(-mean // slices)) // bn) * bn, shortest)
        slm = max(-(-(-(-L // slices)) // bn) * bn, shortest)
        valid = min(_region_end(mean, sl, slices, bn), _region_end(L, slm, slices, bn), LINE_MAX)
        if valid <= 1:  # the next pass is in another region
            a = self._decode(S, context_sum, longest)
            return a, self._decode(S, context_sum + S, longest + 1) - a, 1
        # Passes 0 and 1 in one region: the same slice lengths. `slice_of`, `_attention_parts` and
        # `_attention` inline (the fast-forward calls this for every run of decode passes; the
        # tests hold it to pass_time's figures).
        half, kvS, C = bn / 2, self.kv_heads * S, self.decode_wave
        rates = self.pd_rates[big]
        tb, merge_s, program_s, tail = rates["block_s"], rates["merge_s"], rates["program_s"], rates["tail"]
        spread_s = self.spread_rows(B) * rates["spread_s"]
        rb = self.block_bytes / (rates["kv_gbs"] * 1e9) if rates["kv_gbs"] else 0.0
        graph = self.graph_time(B)

        def at(x: int, y: int) -> tuple:
            work, live, live_b = x / sl, y / slm + 0.5, x / sl + 0.5
            P = kvS * (work if work > 1.0 else 1.0)
            blk = (sl if sl < x + half else x + half) / bn
            crit_t = ((slm if slm < y + half else y + half) / bn + 1) * tb
            full = int(P / C)
            rest = P - full * C
            lat, read_full = (blk + 1) * tb, C * blk * rb
            waves = full * (lat if lat > read_full else read_full) + (lat + tail * rest * blk * rb if rest > 0 else 0.0)
            live, live_b = (live if live > 1.0 else 1.0), (live_b if live_b > 1.0 else 1.0)
            return (graph + (waves if waves > crit_t else crit_t) + live * merge_s + P * program_s
                    + (live - live_b) * spread_s, P, full, lat - read_full, rest, waves - crit_t)

        a, P0, full0, d10, rest0, d30 = at(mean, L)
        f1, P1, full1, d11, rest1, d31 = at(mean + 1, L + 1)
        b = f1 - a  # (the line through the first two passes, even where it holds for one)
        if valid <= 2:
            return a, b, valid
        if full1 != full0 or (rest0 > 0) != (rest1 > 0):  # a wave steps between them
            return a, b, 2
        # In the region every piece is linear in j: the line holds until the full waves step (P
        # crosses a multiple of the wave) or a max() changes its argument.
        if P1 > P0:
            valid = min(valid, max(2, math.ceil(((full0 + 1) * C - P0) / (P1 - P0))))
        if full0 > 0:
            valid = min(valid, _crossing(d10, d11))
        valid = min(valid, _crossing(d30, d31))
        # the line must still hold at its last pass: where it does not (a step the kinks above
        # missed), the run is cut to its first two passes
        end = at(mean + valid - 1, L + valid - 1)[0]
        if abs(end - (a + b * (valid - 1))) > LINE_CHECK * end:
            return a, b, 2
        return a, b, valid

    # ------------------------------------------------------------------ elsewhere

    def projected(self, gpu: GPUSpec, measured_on: GPUSpec) -> "CalibratedCost":
        """This model moved to another GPU: bandwidth terms (weights, KV, decode attention's walk
        through the cache and its merges) by the ratio of the cards' bandwidths, arithmetic
        (projections, chunk attention's blocks) by their arithmetic rates, each decode graph's
        time (and batch 1's fixed time, which is mostly the weights' read) by the ratio of the
        roofline's time for its batch on the two cards; the other fixed costs (per program, per
        sequence, per grid row and slice launched) and the waves' shape (the measured card's SMs)
        stay. A projection, not a measurement: `calibrate fit` reports how far the roofline alone
        is from the measured card, the size of error to expect."""
        bw, fl = gpu.bandwidth_gbs / measured_on.bandwidth_gbs, gpu.fp16_tflops / measured_on.fp16_tflops

        def roof(m: int, spec: GPUSpec) -> float:
            return spec.floor_s(self.weight_bytes, m * self.flops_per_token)

        out = copy.deepcopy(self)
        out.p1 = dict(self.p1, fixed_s=self.p1["fixed_s"] * roof(1, gpu) / roof(1, measured_on),  # the weights' read
                      serial_s_per_token=self.p1["serial_s_per_token"] / bw, merge_s=self.p1["merge_s"] / bw)
        out.pd_rates = {k: dict(v, kv_gbs=v["kv_gbs"] * bw, block_s=v["block_s"] / bw, merge_s=v["merge_s"] / bw)
                        for k, v in self.pd_rates.items()}
        out.graph_s = {b: t * roof(b, gpu) / roof(b, measured_on) for b, t in self.graph_s.items()}
        if self.schedule is not None:
            out.schedule = dict(self.schedule, kv_gbs=self.schedule["kv_gbs"] * bw, block_s=self.schedule["block_s"] / bw)
        out.pp = dict(self.pp, weight_gbs=self.pp["weight_gbs"] * bw, matmul_tflops=self.pp["matmul_tflops"] * fl,
                      block_s=self.pp["block_s"] / fl)
        if self.mixed is not None:
            out.mixed = dict(self.mixed, weight_gbs=self.mixed["weight_gbs"] * bw,
                             matmul_tflops=self.mixed["matmul_tflops"] * fl, block_s=self.mixed["block_s"] / fl)
        out.gpu, out.free_gib, out.kv_blocks = f"{gpu.name} (projected from {self.gpu})", None, None
        out.heat = Heat()  # the measured card's power behaviour, not the other's
        return out

    def projected_to_model(self, measured: ModelConfig, target: ModelConfig, gpu: GPUSpec) -> "CalibratedCost":
        """This calibration of `measured` on `gpu` moved to another model, `target`, on the same
        card: a projection, not a measurement (its error against a second model's own calibration
        has not been measured yet). Every term follows the model quantity it stands for:

        - the weights' read, the projections' FLOPs and the KV bytes a block holds: the file's
          constants times the target's over the measured model's (weight bytes, FLOPs per token,
          KV bytes per token), at the fitted rates (weight_gbs, matmul_tflops, kv_gbs stay: the
          card's); decode attention's programs by the target's KV heads (the grid is batch x KV
          heads x slices; the slicing, `fills_gpu` and the buckets are the engine's and stay);
        - a CUDA graph's time beyond the roofline of its batch (the card's preset rates): what is
          left at the smallest batches is kernels' launch and latency, paid once per kernel, so
          per layer: it scales with the layer count; what grows with the batch on top of it is
          the matrix multiplies' shortfall from the roofline, which scales with the roofline's
          time. Per bucket B, with F the least excess over the buckets: graph(B) = F x layers' +
          (graph(B) - F) x roof'(B) / roof(B); batch 1's fixed time likewise, all its excess
          over its weight read being per-layer latency;
        - per-layer latencies (a decode block's walk, a slice's merge, a program's or a tile's
          start, batch 1's serial walk, a prefill pass's fixed time, an eager pass's kernel
          launches on the GPU and on the host): by the layer count; chunk attention's blocks,
          which are arithmetic on tiles of a fixed number of rows, by layers x head dim; its
          tiles hold as many (token, query head) rows as the engine's (a power of two: 128), so
          tokens a tile = rows // the target's query heads per KV head;
        - what is the card's or the host's alone stays: the waves' shape, the heat, the scatter,
          the host's planning and batch building (per pass, per token, per sequence), the
          partial wave's `tail` and the overlap `shared`; the memory left for the KV cache moves by
          the weights' difference.
        """
        lr = target.num_hidden_layers / measured.num_hidden_layers
        wr = target.weight_bytes_read_per_pass() / measured.weight_bytes_read_per_pass()
        fr = target.flops_per_token(0) / measured.flops_per_token(0)
        kr = target.kv_bytes_per_token() / measured.kv_bytes_per_token()
        hr = target.head_dim / measured.head_dim
        out = copy.deepcopy(self)
        out.model = target.name
        out.weight_bytes, out.flops_per_token, out.kv_bytes = self.weight_bytes * wr, self.flops_per_token * fr, \
            self.kv_bytes * kr
        group = measured.num_attention_heads // measured.num_key_value_heads
        target_group = target.num_attention_heads // target.num_key_value_heads
        if target_group != group:
            rows = 1 << (self.tile_tokens * group - 1).bit_length()  # the engine's tile rows (a power of two)
            out.tile_tokens = max(1, rows // target_group)
        out.kv_heads = target.num_key_value_heads
        out.block_bytes = out.kv_bytes * out.block_n / out.kv_heads

        def roof(b: int, weight_bytes: float, flops: float) -> float:
            return gpu.floor_s(weight_bytes, b * flops)

        def graph(t: float, b: int, fixed: float) -> float:
            before, after = roof(b, self.weight_bytes, self.flops_per_token), roof(b, out.weight_bytes,
                                                                                  out.flops_per_token)
            return fixed * lr + (t - fixed) * after / before

        least = min(t - roof(b, self.weight_bytes, self.flops_per_token) for b, t in self.graph_s.items())
        out.graph_s = {b: graph(t, b, max(0.0, least)) for b, t in self.graph_s.items()}
        batch1 = self.p1["fixed_s"] - roof(1, self.weight_bytes, self.flops_per_token)
        out.p1 = dict(self.p1, fixed_s=graph(self.p1["fixed_s"], 1, max(0.0, batch1)),
                      serial_s_per_token=self.p1["serial_s_per_token"] * lr, merge_s=self.p1["merge_s"] * lr)
        out.pd_rates = {k: dict(v, block_s=v["block_s"] * lr, merge_s=v["merge_s"] * lr,
                                program_s=v["program_s"] * lr, spread_s=v["spread_s"] * lr)
                        for k, v in self.pd_rates.items()}
        if self.schedule is not None:
            out.schedule = dict(self.schedule, block_s=self.schedule["block_s"] * lr,
                                start_s=self.schedule["start_s"] * lr)
        out.pp = dict(self.pp, fixed_s=self.pp["fixed_s"] * lr, eager_s=self.pp["eager_s"] * lr,
                      block_s=self.pp["block_s"] * lr * hr, program_s=self.pp["program_s"] * lr)
        if self.mixed is not None:
            out.mixed = dict(self.mixed, fixed_s=self.mixed["fixed_s"] * lr, block_s=self.mixed["block_s"] * lr * hr,
                             start_s=self.mixed["start_s"] * lr)
        out.host = replace(self.host, eager_launch_s=self.host.eager_launch_s * lr)
        if self.free_gib is not None:
            moved = (target.weight_bytes() - measured.weight_bytes()) / GIB  # in memory: an untied embedding too
            out.free_gib = self.free_gib - moved
            if out.free_gib <= 0:
                raise ValueError(f"{target.name}'s weights leave no memory for the KV cache on {self.gpu} "
                                 f"({self.free_gib:g} GiB free with {measured.name}'s)")
        out.kv_blocks = None
        out.projected_from = measured.name
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
        check_schema(d, path)
        if model is not None and d["model"] != model:
            raise ValueError(f"{path} is a cost model for {d['model']!r}, but this run simulates {model!r}; "
                             f"calibrate for {model!r}, pass --model {d['model']}, or ask for it projected to "
                             f"{model!r}: --cost calibrated:{d['model']}/NAME")
        try:
            return cls(d, str(path))
        except KeyError as e:
            raise ValueError(f"{path}: missing {e}") from None
        except (TypeError, AttributeError) as e:
            raise ValueError(f"{path}: not the shape of a calibration file ({e})") from None


def check_schema(doc: dict, path) -> None:
    """A calibration file against `calibration.schema.json` (the fields and types the cost model
    reads), before any of it is used: the first misfit named by its place in the file."""
    import jsonschema
    schema = json.loads((resources.files("sim") / "calibration.schema.json").read_text())
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(doc))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "the top level"
        if error.validator == "required":
            missing = next(k for k in error.validator_value if k not in error.instance)
            raise ValueError(f"{path}: not a calibration file: missing {missing!r} at {where}")
        if error.validator == "anyOf" and not isinstance(error.instance, dict):  # a number of the model's
            dotted = ".".join(str(p) for p in error.absolute_path)
            raise ValueError(f"{path}: {dotted} must be a finite number, got {error.instance!r}")
        raise ValueError(f"{path}: not a calibration file: at {where}, {error.message}")


class _NotANumber(ValueError):
    """NaN or Infinity in a calibration file (JSON has neither; Python writes them)."""


def smoothed(weights, projections, k: float):
    """The projections' time: the weight read or the arithmetic, whichever is longer (k = 0), or
    their k-norm (k > 0: near the ridge, where the two are alike, the GEMMs' tiles neither stream
    the weights at the read rate nor compute at the arithmetic rate; the larger bound still rules
    far from it). Scalars (the simulator's, without numpy's cost) or numpy arrays."""
    array = isinstance(weights, np.ndarray) or isinstance(projections, np.ndarray)
    top = np.maximum(weights, projections) if array else max(weights, projections)
    if not k:
        return top
    k = max(k, 1.0)  # (1: their sum, no overlap at all; a k below counts as 1)
    safe = np.where(top > 0, top, 1.0) if array else top or 1.0  # (over the larger: no power underflows)
    return top * ((weights / safe) ** k + (projections / safe) ** k) ** (1.0 / k)


def _attention(parts: tuple) -> float:
    """decode_attention from its pieces (`CalibratedCost._attention_parts`)."""
    full, lat, read_full, read_rest, rest, crit_t, linear = parts
    return max(full * max(lat, read_full) + (lat + read_rest if rest > 0 else 0.0), crit_t) + linear


def _region_end(length: int, sl: int, slices: int, bn: int) -> int:
    """`CalibratedCost._region_end` of a context whose slices are sl positions long."""
    if -(-sl // 2) > length:  # (sl or block_n odd: the first whole position past the kink)
        return -(-sl // 2) - length
    if sl - bn // 2 > length:
        return sl - bn // 2 - length
    if sl > length:
        return sl - length
    return slices * sl + 1 - length


def _crossing(d0: float, d1: float) -> int:
    """Passes j from 0 for which x - y, linear in j and d0, d1 at j = 0, 1, keeps the sign it has
    at 1 (a max(x, y) keeps its argument): 2 when it changes between 0 and 1."""
    if (d0 > 0) != (d1 > 0) or (d0 < 0) != (d1 < 0):
        return 2
    slope = d1 - d0
    if d1 == 0 or slope == 0 or (d1 > 0) == (slope > 0):
        return ALWAYS
    return max(2, math.ceil(1 + abs(d1 / slope)))


def _refuse_constant(name: str):
    raise _NotANumber(name)


def _line_of(text: str, name: str) -> int:
    """The line of the first `name` written as a bare JSON value."""
    found = re.search(r"[:\[,]\s*" + re.escape(name), text)
    return text.count("\n", 0, found.end()) + 1 if found else 1
