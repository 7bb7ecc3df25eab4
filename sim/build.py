"""From a run's description (what the CLI and the sweep ask for) to a simulated run.

`RunSpec` holds one run's choices as plain values, so that a sweep can vary them and send them
to worker processes; `simulate_spec` builds the trace, cost model, schedulers and cluster it
describes and runs it. The names users type map to classes in the three dicts below.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from engine.config import get_preset
from engine.roofline import get_gpu
from sim.cluster import LeastKVLoad, LeastOutstanding, PowerOfTwo, RoundRobin
from sim.cost import CalibratedCost, parse_cost
from sim.kv import KVCache, PrefixCache, blocks_for_gpu
from sim.policy import (ChunkedPrefill, ContinuousBatching, DecodePriority, StaticBatching, by_priority,
                        shortest_prompt_first)
from sim.run import Disaggregation, SimResult, simulate
from traces.generate import poisson
from traces.io import load_trace
from traces.trace import Trace

POLICIES = {
    "static": StaticBatching,
    "continuous": ContinuousBatching,
    "chunked": ChunkedPrefill,
    "decode-priority": DecodePriority,
}
ROUTERS = {
    "round-robin": RoundRobin,
    "least-outstanding": LeastOutstanding,
    "least-kv": LeastKVLoad,
    "power-of-two": PowerOfTwo,
}
ORDERS = {"fcfs": None, "priority": by_priority, "spf": shortest_prompt_first}


@dataclass(frozen=True)
class RunSpec:
    """One run. Sizes in tokens, blocks or requests; times in seconds; bandwidths in GB/s."""

    trace: str
    policy: str = "continuous"
    cost: str = "roofline:h200"
    model: str = "qwen2.5-1.5b"
    trace_format: str | None = None
    gpu: str = "h200"  # for the KV capacity when the cost model doesn't name a GPU preset
    overhead_s: float = 3e-4  # roofline per-pass overhead
    replicas: int = 1
    router: str = "round-robin"
    order: str = "fcfs"
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None  # default: the model's context length
    block_size: int = 16
    kv_blocks: int | None = None  # default: what fits in the GPU's free memory
    kv_gib: float | None = None
    preemption: str = "recompute"
    swap_gbs: float = 25.0
    batch_size: int = 8  # static
    batch_timeout_s: float = 0.5  # static
    prefix_caching: bool = False
    hash_block_tokens: int = 512
    prefill_replicas: int = 0  # > 0: disaggregated, with decode_replicas
    decode_replicas: int = 0
    kv_link_gbs: float = 50.0
    kv_link_latency_s: float = 0.0
    rate: float | None = None  # Poisson arrivals at this rate, lengths from the trace
    rate_scale: float = 1.0  # or the trace's own arrivals, sped up this much
    limit: int | None = None  # first N requests only
    seed: int = 0
    keep_token_times: bool = False
    log_passes: bool = False
    fast_forward: bool = True
    run_id: str = "sim"

    def __post_init__(self) -> None:
        for name, table in (("policy", POLICIES), ("router", ROUTERS), ("order", ORDERS)):
            if getattr(self, name) not in table:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; choose from {', '.join(table)}")
        if self.preemption not in ("recompute", "swap"):
            raise ValueError(f"unknown preemption {self.preemption!r}; choose recompute or swap")
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"rate must be positive, got {self.rate}")
        if self.rate_scale <= 0:
            raise ValueError(f"rate_scale must be positive, got {self.rate_scale}")
        if (self.prefill_replicas > 0) != (self.decode_replicas > 0):
            raise ValueError("disaggregation needs both prefill and decode replicas")

    def with_(self, **changes) -> "RunSpec":
        return replace(self, **changes)


@lru_cache(maxsize=4)
def load_trace_file(path: str, fmt: str | None = None) -> Trace:
    """A trace file in any format `traces.io` reads (detected, or named by `fmt`); cached, as a
    sweep's worker replays the same file many times."""
    return load_trace(path, fmt=fmt)


def shape_arrivals(trace: Trace, rate: float | None, rate_scale: float, limit: int | None, seed: int) -> Trace:
    """The trace's first `limit` requests, arriving either as a Poisson process at `rate` (seeded,
    first at t = 0; the lengths keep their order) or at the trace's own times, sped up
    `rate_scale` times."""
    if limit is not None and limit < len(trace):
        trace = trace.take(np.arange(limit))
    if rate is not None:
        arrival = poisson(rate, n=len(trace), seed=seed).arrival_s
    elif rate_scale != 1.0:
        arrival = (trace.arrival_s - (trace.arrival_s[0] if len(trace) else 0.0)) / rate_scale
    else:
        return trace
    return Trace(arrival, trace.prompt_tokens, trace.output_tokens, trace.request_id, trace.priority,
                 trace.block_hashes, trace.name)


def simulate_spec(spec: RunSpec, trace: Trace | None = None) -> SimResult:
    """Build everything `spec` describes and run it (`trace` replaces spec.trace when given)."""
    model = get_preset(spec.model)
    cost, gpu_preset = parse_cost(spec.cost, spec.model, spec.overhead_s)
    gpu = gpu_preset or get_gpu(spec.gpu)
    free_gib = spec.kv_gib
    if free_gib is None and isinstance(cost, CalibratedCost):
        free_gib = cost.free_gib
    num_blocks = spec.kv_blocks or blocks_for_gpu(model, gpu, spec.block_size, free_gib)
    max_model_len = spec.max_model_len or model.context_length
    swap = spec.swap_gbs * 1e9 if spec.preemption == "swap" else None
    kv_bytes = model.kv_bytes_per_token()
    order = ORDERS[spec.order]

    def kv() -> KVCache:
        if spec.prefix_caching:
            return PrefixCache(num_blocks, spec.block_size, spec.hash_block_tokens, bytes_per_token=kv_bytes,
                               swap_bytes_per_s=swap)
        return KVCache(num_blocks, spec.block_size, kv_bytes, swap)

    def make_scheduler():
        cls = POLICIES[spec.policy]
        if cls is StaticBatching:
            return StaticBatching(kv(), spec.batch_size, spec.batch_timeout_s, max_model_len, order)
        budget = {"max_num_batched_tokens": spec.max_num_batched_tokens} if spec.max_num_batched_tokens else {}
        return cls(kv(), max_num_seqs=spec.max_num_seqs, max_model_len=max_model_len, order=order, **budget)

    def make_decode_scheduler():
        return ChunkedPrefill(KVCache(num_blocks, spec.block_size, kv_bytes, swap), spec.max_num_seqs,
                              max(2048, spec.max_num_seqs), max_model_len, order)

    if trace is None:
        trace = load_trace_file(spec.trace, spec.trace_format)
    trace = shape_arrivals(trace, spec.rate, spec.rate_scale, spec.limit, spec.seed)
    disaggregate = None
    if spec.prefill_replicas:
        if spec.policy == "static":
            raise ValueError("disaggregation needs a continuous policy on its prefill replicas, not static")
        disaggregate = Disaggregation(spec.prefill_replicas, spec.decode_replicas, make_decode_scheduler,
                                      kv_bytes, spec.kv_link_gbs * 1e9, spec.kv_link_latency_s,
                                      ROUTERS[spec.router](spec.seed + 1))
    return simulate(trace, make_scheduler, cost, spec.replicas, ROUTERS[spec.router](spec.seed),
                    disaggregate=disaggregate, keep_token_times=spec.keep_token_times,
                    log_passes=spec.log_passes, fast_forward=spec.fast_forward, run_id=spec.run_id)
