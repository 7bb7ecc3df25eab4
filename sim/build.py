"""From a run's description (what the CLI and the sweep ask for) to a simulated run.

`RunSpec` holds one run's choices as plain values, so that a sweep can vary them and send them
to worker processes. Each field is declared once, here, with its help text: the command line
(`sim.__main__`) builds its options from these fields, and the fields marked `axis` are the
ones a sweep can vary. `simulate_spec` builds the trace, cost model, schedulers and cluster a
spec describes and runs it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache

import numpy as np

from core.config import PRESETS, resolve_model
from core.kv import BlockPool, PrefixBlockPool, blocks_for_gpu
from core.roofline import GIB, get_gpu
from core.routers import ROUTERS, make_router
from core.scheduler import ORDERS, POLICIES, ChunkedPrefill, make_scheduler
from sim.cost import DEFAULT as DEFAULT_COST, default_cost, parse_cost
from sim.noise import NoisyCost, measured_noise
from sim.replica import SwapLink
from sim.run import Disaggregation, SimResult, simulate
from traces.download import resolve_trace
from traces.io import FORMATS, NeedsSorting, count_trace, iter_trace, load_trace
from traces.tools import shape_arrivals, shape_chunks
from traces.trace import MAX_ARRIVAL_S, Trace

# Bounds of the options that are times or bandwidths: no time past MAX_ARRIVAL_S (1e8 s, the
# longest trace), no bandwidth under 1 kB/s (a whole 32k-token KV cache then moves in 10 days),
# so that the simulated clock stays finite and exact.
MIN_GBS = 1e-6


MAX_REPLICAS = 100_000  # an idle replica holds about 17 KB: 10,000 on 300 requests peak at about 170 MB


def option(default, help: str, *, type=None, choices=None, axis: bool = False, low=None, above=None, high=None,
           flags: tuple[str, ...] = ()):
    """A RunSpec field that is also a command-line option: `help` and `choices` for --help,
    `type` to parse it, `axis` when a sweep may vary it, and its bounds (`low` <= value, or
    `above` < value; value <= `high`) checked for every run. `flags` names the option when its
    name is not the field's (vLLM's first, then the older names kept as aliases)."""
    meta = {"help": help, "type": type, "choices": choices, "axis": axis, "low": low, "above": above, "high": high,
            "flags": flags}
    return field(default=default, metadata=meta)


def option_flags(f) -> tuple[str, ...]:
    """The option strings of a RunSpec field, vLLM's name first."""
    return f.metadata["flags"] or ("--" + f.name.replace("_", "-"),)


@dataclass(frozen=True)
class RunSpec:
    """One run. Sizes in tokens, blocks or requests; times in seconds unless the name says ms;
    bandwidths in GB/s."""

    trace: str = option(None, "trace file (the project's CSV, or any format traces.io reads) or a public "
                              "trace's name, e.g. azure-conv-2023", type=str)
    trace_format: str | None = option(None, "trace format; detected when omitted", type=str, choices=FORMATS)
    policy: str = option("continuous", "scheduling policy", type=str, choices=tuple(POLICIES), axis=True)
    cost: str = option(DEFAULT_COST, "auto (the calibration for --model on --gpu when one exists, else the "
                                     "nearest calibrated model's on that GPU projected to --model, else the GPU's "
                                     "roofline; either said on stderr), roofline:GPU (a preset: h200, h100-sxm, "
                                     "a100-80gb, a10, ...), constant:SECONDS, calibrated:NAME[@GPU] (@GPU: projected "
                                     "to that card), calibrated:MODEL/NAME (another model's calibration projected to "
                                     "--model) or a calibration JSON (see sim/cost.py); *FACTOR after it makes every "
                                     "pass FACTOR times as long (calibrated:h200*1.02)", type=str, axis=True)
    model: str = option("qwen2.5-1.5b", f"model preset ({', '.join(PRESETS)}) or a Hugging Face config.json; a "
                                        "calibration file must match it (calibrated:MODEL/NAME projects another "
                                        "model's)", type=str)
    gpu: str | None = option(None, "GPU preset sizing the KV cache when --cost names no GPU (default h200)",
                             type=str)
    overhead_ms: float = option(0.3, "roofline: fixed time per pass, ms", type=float, low=0, high=MAX_ARRIVAL_S * 1e3)
    replicas: int = option(1, "replicas behind the router", type=int, axis=True, low=1, high=MAX_REPLICAS)
    router: str = option("round-robin", "how arriving requests pick a replica", type=str, choices=tuple(ROUTERS))
    order: str = option("fcfs", "queue order: fcfs, priority (the trace's priority classes), spf (shortest "
                                "prompt first)", type=str, choices=tuple(ORDERS))
    max_num_seqs: int = option(256, "most sequences running at once", type=int, axis=True, low=1)
    max_num_batched_tokens: int | None = option(None, "token budget per pass (default: max(max-model-len, "
                                                      "2048); chunked: 2048)", type=int, low=1)
    max_model_len: int | None = option(None, "longest prompt + output accepted (default: the model's "
                                             "context)", type=int, low=2)
    block_size: int = option(16, "tokens per KV block", type=int, low=1)
    kv_blocks: int | None = option(None, "KV cache size in blocks (default: the GPU's free memory)", type=int, low=1)
    kv_gib: float | None = option(None, "or the memory for the KV cache, GiB", type=float, above=0)
    preemption: str = option("recompute", "what a preempted request loses: its cache (recompute) or "
                                          "nothing (swap to host memory)", type=str, choices=("recompute", "swap"))
    swap_gbs: float = option(25.0, "swap: host <-> GPU bandwidth, GB/s", type=float, low=MIN_GBS)
    batch_size: int = option(8, "static: requests per batch", type=int, low=1)
    batch_timeout_s: float = option(0.5, "static: longest wait for a full batch, s", type=float, low=0,
                                    high=MAX_ARRIVAL_S)
    prefix_caching: bool = option(False, "reuse prompt blocks by the trace's block hashes", type=bool)
    hash_block_tokens: int = option(512, "tokens per trace block hash (Mooncake: 512)", type=int, low=1)
    disaggregate: str | None = option(None, "P:D: P prefill and D decode replicas instead of --replicas",
                                      type=str)
    kv_link_gbs: float = option(50.0, "disaggregation: KV transfer bandwidth, GB/s", type=float, low=MIN_GBS)
    kv_link_latency_ms: float = option(0.0, "disaggregation: KV transfer latency, ms", type=float, low=0,
                                       high=MAX_ARRIVAL_S * 1e3)
    rate: float | None = option(None, "requests per second: new arrival times drawn at this rate (Poisson, or gamma "
                                      "with --burstiness; seeded), the lengths taken from the trace in its order",
                                type=float, axis=True, above=0, flags=("--request-rate", "--rate"))
    burstiness: float = option(1.0, "with --request-rate: how bursty the arrivals are, as vLLM's flag (gamma gaps "
                                    "of this shape: 1 Poisson, below 1 burstier, above 1 steadier)", type=float,
                               above=0)
    rate_scale: float = option(1.0, "replay the trace's own arrivals this many times faster", type=float,
                               axis=True, above=0)
    limit: int | None = option(None, "replay only the trace's first N requests", type=int, low=1,
                               flags=("--num-prompts", "--limit"))
    seed: int = option(0, "seed of everything drawn at random (--request-rate arrivals, power-of-two, --noise)", type=int, low=0)
    overlap: bool = option(False, "model the engine's overlap mode: each pass planned while the one before it "
                                  "runs, so an arrival waits for one more pass", type=bool)
    noise: bool = option(False, "scatter pass and host times as the calibration measured the engine's own (its "
                                "\"noise\" field; seeded by --seed: replications give a spread of schedules)", type=bool)
    # not command-line options: what a run keeps, and its name
    keep_token_times: bool = False  # (and each request's queued_s and scheduled_s)
    log_passes: bool = False
    fast_forward: bool = True
    run_id: str = "sim"
    stream: bool = False  # read the trace file a chunk at a time as the run reaches it (see check_trace)

    def __post_init__(self) -> None:
        if self.trace is None:
            raise ValueError("a run needs a trace (--trace FILE or a public trace's name)")
        for f in fields(self):
            meta, value = f.metadata, getattr(self, f.name)
            if not meta or value is None:
                continue
            flag = "/".join(option_flags(f))  # as argparse names it: --request-rate/--rate
            if meta["choices"] is not None and value not in meta["choices"]:
                raise ValueError(f"{flag}: unknown {f.name.replace('_', ' ')} {value!r}; choose from "
                                 f"{', '.join(meta['choices'])}")
            if meta["low"] is None and meta["above"] is None and meta["high"] is None:
                continue
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{flag} must be a finite number, got {value}")
            if meta["low"] is not None and value < meta["low"]:
                raise ValueError(f"{flag} must be at least {meta['low']}, got {value}")
            if meta["above"] is not None and not value > meta["above"]:
                raise ValueError(f"{flag} must be greater than {meta['above']}, got {value}")
            if meta["high"] is not None and value > meta["high"]:
                raise ValueError(f"{flag} must be at most {meta['high']:g}, got {value}")
        resolve_model(self.model)  # a preset, or a config.json the engine could run
        if self.gpu is not None:
            try:
                get_gpu(self.gpu)
            except ValueError as e:
                raise ValueError(f"--gpu: {e}") from None
        self.split_disaggregation()  # checks the P:D form
        if self.burstiness != 1.0 and self.rate is None:
            raise ValueError("--burstiness shapes the arrivals --request-rate draws; give --request-rate too")
        if self.cost == DEFAULT_COST:  # (frozen: set once, here, so every copy and record names the model used)
            object.__setattr__(self, "cost", default_cost(self.model, self.gpu))

    def with_(self, **changes) -> "RunSpec":
        return replace(self, **changes)

    def split_disaggregation(self) -> tuple[int, int]:
        """(prefill replicas, decode replicas); (0, 0) when not disaggregated."""
        if self.disaggregate is None:
            return 0, 0
        try:
            p, d = (int(v) for v in self.disaggregate.split(":"))
        except ValueError:
            raise ValueError(f"--disaggregate {self.disaggregate!r}: expected P:D, e.g. 1:3") from None
        if p < 1 or d < 1:
            raise ValueError(f"--disaggregate {self.disaggregate!r}: needs at least one prefill and one decode "
                             "replica")
        if p + d > MAX_REPLICAS:
            raise ValueError(f"--disaggregate {self.disaggregate!r}: at most {MAX_REPLICAS:,} replicas in all")
        return p, d

    @property
    def draws_at_random(self) -> bool:
        """Does the seed change anything (so that replications differ)?"""
        return self.rate is not None or self.router == "power-of-two" or self.noise


def cli_fields() -> list:
    """The RunSpec fields that are command-line options, in declaration order."""
    return [f for f in fields(RunSpec) if f.metadata]


AXES = tuple(f.name for f in cli_fields() if f.metadata["axis"])
TEXT_AXES = tuple(f.name for f in cli_fields() if f.metadata["axis"] and f.metadata["type"] is str)  # policy, cost


@lru_cache(maxsize=4)
def scan_trace_file(path: str, fmt: str | None = None) -> tuple[int, dict[str, np.ndarray]]:
    """Requests in a trace file (or a public trace by name), every row checked, one chunk in
    memory at a time, and the lines its loader left out by reason (`Trace.left_out`); cached."""
    left_out: dict[str, np.ndarray] = {}
    return count_trace(resolve_trace(path), fmt=fmt, left_out=left_out), left_out


def count_trace_file(path: str, fmt: str | None = None) -> int:
    """Requests in a trace file (or a public trace by name), as `scan_trace_file` counts them."""
    return scan_trace_file(path, fmt)[0]


def trace_left_out(spec: RunSpec) -> dict[str, np.ndarray]:
    """The rows of the spec's trace file that its loader left out, by reason (their lines), from
    what `check_trace` read (cached)."""
    if spec.stream:
        return scan_trace_file(spec.trace, spec.trace_format)[1]
    return load_trace_file(spec.trace, spec.trace_format).left_out


STREAM_ABOVE_BYTES = 64 << 20  # trace files larger than this stream through a run; smaller ones are loaded once


def check_trace(spec: RunSpec) -> tuple[RunSpec, int]:
    """Check every row of the spec's trace before any work, and say how many requests the run
    replays: (the spec, the count). A file larger than STREAM_ABOVE_BYTES is read a chunk at a
    time here and again during the run (the spec returned is set to stream); a smaller one, or a
    public file out of time order (it must be sorted), is loaded whole, once."""
    n, path = None, resolve_trace(spec.trace)
    if path.is_file() and path.stat().st_size > STREAM_ABOVE_BYTES:
        try:
            n, spec = count_trace_file(spec.trace, spec.trace_format), spec.with_(stream=True)
        except NeedsSorting:
            pass
    if n is None:
        trace = load_trace_file(spec.trace, spec.trace_format)
        check_order(spec, trace)
        n = len(trace)
    else:
        check_order(spec, next(iter_trace(path, spec.trace_format), None))
    return spec, min(n, spec.limit or n)


def check_order(spec: RunSpec, trace: Trace | None) -> None:
    """--order priority needs a trace with priority classes (else every request is class 0 and
    the run is FCFS without saying so)."""
    if spec.order == "priority" and trace is not None and trace.priority is None:
        raise ValueError(f"--order priority: {spec.trace} has no priority column, so every request would "
                         "have the same class; add one, or use --order fcfs or spf")


@lru_cache(maxsize=4)
def load_trace_file(path: str, fmt: str | None = None) -> Trace:
    """A trace file in any format `traces.io` reads (detected, or named by `fmt`), or a public
    trace by name; cached, as a sweep's worker replays the same file many times."""
    return load_trace(resolve_trace(path), fmt=fmt)


def check_spec(spec: RunSpec) -> None:
    """Build what `simulate_spec` builds before it reads the trace (the cost model, the KV cache,
    a scheduler), so that a sweep's bad point fails before any point runs."""
    simulate_spec(spec, check_only=True)


def simulate_spec(spec: RunSpec, trace: Trace | None = None, check_only: bool = False,
                  cost_model=None) -> SimResult | None:
    """Build everything `spec` describes and run it (`trace` replaces spec.trace when given;
    `spec.stream` reads spec.trace a chunk at a time as the run goes, else it is loaded whole).
    With `check_only`, stop (returning None) once everything but the trace is built.
    `cost_model` replaces spec.cost's (a replay of measured pass times, `sim.replay`)."""
    model = resolve_model(spec.model)
    cost, gpu_preset = parse_cost(spec.cost, spec.model, spec.overhead_ms / 1e3)
    if cost_model is not None:
        cost = cost_model
    if spec.noise:
        noise = measured_noise(cost)
        if noise is None:
            raise ValueError(f"--noise: the cost model ({spec.cost}) measured no scatter; --noise needs a "
                             "calibration with a \"noise\" field (calibrated:NAME)")
        cost = NoisyCost(cost, noise, spec.seed)
    if spec.gpu is not None and gpu_preset is not None and get_gpu(spec.gpu).name != gpu_preset.name:
        raise ValueError(f"--gpu {spec.gpu} but --cost {spec.cost} times passes on {gpu_preset.name}; drop --gpu, or "
                         f"project a calibration with --cost calibrated:NAME@{spec.gpu}")
    gpu = gpu_preset or get_gpu(spec.gpu or "h200")
    free_gib = spec.kv_gib
    if free_gib is None:  # the memory the calibrated engine had (through a scaled or noisy model's too)
        free_gib = getattr(cost, "free_gib", None)
    num_blocks = spec.kv_blocks or blocks_for_gpu(model, gpu, spec.block_size, free_gib)
    if spec.max_model_len is not None and spec.max_model_len > model.context_length:
        raise ValueError(f"--max-model-len {spec.max_model_len} is past {spec.model}'s context of "
                         f"{model.context_length} tokens")
    max_model_len = spec.max_model_len or model.context_length
    if num_blocks * spec.block_size < max_model_len:
        cache = (f"--kv-blocks {spec.kv_blocks}" if spec.kv_blocks else f"--kv-gib {spec.kv_gib:g}" if spec.kv_gib
                 else f"the KV memory of {gpu.name}" + (f" ({free_gib:g} GiB)" if free_gib else ""))
        raise ValueError(f"{cache} holds {num_blocks * spec.block_size:,} tokens ({num_blocks:,} blocks of --block-size "
                         f"{spec.block_size}), fewer than one request of --max-model-len {max_model_len:,}: give the "
                         "cache more memory (--kv-blocks, --kv-gib) or lower --max-model-len")
    kv_bytes = model.kv_bytes_per_token()
    if spec.kv_gib is not None or spec.kv_blocks:  # a cache the user sized: it must fit beside the weights
        cache_gib = num_blocks * spec.block_size * kv_bytes / GIB
        weights_gib = model.weight_bytes() / GIB  # in memory: a separate embedding table too
        card_gib = gpu.memory_gb * 1e9 / GIB
        if cache_gib + weights_gib > card_gib:
            given = f"--kv-blocks {spec.kv_blocks:,}" if spec.kv_blocks else f"--kv-gib {spec.kv_gib:g}"
            raise ValueError(f"{given} ({cache_gib:,.1f} GiB of KV cache) and {spec.model}'s weights ({weights_gib:.1f} "
                             f"GiB) do not fit in {gpu.name}'s {card_gib:.1f} GiB: at most "
                             f"{max(0.0, card_gib - weights_gib):.1f} GiB of cache")
    swap_link = SwapLink(kv_bytes, spec.swap_gbs * 1e9) if spec.preemption == "swap" else None

    def kv() -> BlockPool:
        if spec.prefix_caching:
            return PrefixBlockPool(num_blocks, spec.block_size, spec.hash_block_tokens)
        return BlockPool(num_blocks, spec.block_size)

    def scheduler():
        return make_scheduler(spec.policy, kv(), max_num_seqs=spec.max_num_seqs,
                              max_num_batched_tokens=spec.max_num_batched_tokens, max_model_len=max_model_len,
                              order=spec.order, preemption=spec.preemption, batch_size=spec.batch_size,
                              batch_timeout_s=spec.batch_timeout_s)

    def make_decode_scheduler():
        return ChunkedPrefill(BlockPool(num_blocks, spec.block_size), spec.max_num_seqs,
                              max(2048, spec.max_num_seqs), max_model_len, ORDERS[spec.order],
                              preemption=spec.preemption)

    prefill_replicas, decode_replicas = spec.split_disaggregation()
    if prefill_replicas and spec.policy == "static":
        raise ValueError("disaggregation needs a continuous policy on its prefill replicas, not static")
    if check_only:
        scheduler(), make_decode_scheduler() if prefill_replicas else None
        return None
    if trace is None and spec.stream:
        count = count_trace_file(spec.trace, spec.trace_format) if spec.rate is not None else None
        trace = shape_chunks(iter_trace(resolve_trace(spec.trace), spec.trace_format), spec.rate, spec.rate_scale,
                             spec.limit, spec.seed, count, spec.burstiness)
    else:
        if trace is None:
            trace = load_trace_file(spec.trace, spec.trace_format)
        trace = shape_arrivals(trace, spec.rate, spec.rate_scale, spec.limit, spec.seed, spec.burstiness)
    disaggregate = None
    if prefill_replicas:
        disaggregate = Disaggregation(prefill_replicas, decode_replicas, make_decode_scheduler,
                                      kv_bytes, spec.kv_link_gbs * 1e9, spec.kv_link_latency_ms / 1e3,
                                      make_router(spec.router, spec.seed + 1))
    return simulate(trace, scheduler, cost, spec.replicas, make_router(spec.router, spec.seed),
                    disaggregate=disaggregate, keep_token_times=spec.keep_token_times,
                    log_passes=spec.log_passes, fast_forward=spec.fast_forward, run_id=spec.run_id,
                    swap_link=swap_link, overlap=spec.overlap)
