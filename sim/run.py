"""One simulated run: a trace's requests arrive, replicas serve them, records come out.

Following one request: `arrivals` turns its trace row into a `Sequence` at its arrival time and
submits it to the cluster, which rejects it (with the reason) or routes it to a replica; the
replica's loop (`sim.replica`) runs the passes its scheduler plans (`core.scheduler`) for the time
the cost model gives (`sim.cost`); when the sequence leaves, `Sequence.record()` makes its
RequestRecord, and `core.metrics.compute_metrics` turns the records into the metrics table.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Callable

import simpy

from core.records import PassRecord, RequestRecord
from core.scheduler import Scheduler, Sequence
from core.routers import RoundRobin
from sim.cluster import Cluster, DisaggregatedCluster
from sim.cost import CostModel
from sim.replica import Replica, SwapLink
from traces.trace import Trace


@dataclass
class Disaggregation:
    """Separate prefill and decode replicas; `make_decode_scheduler` builds a decode replica's
    scheduler (chunked prefill suits: a transferred request joins the decode batch at once)."""

    prefill_replicas: int
    decode_replicas: int
    make_decode_scheduler: Callable[[], Scheduler]
    kv_bytes_per_token: int
    link_bytes_per_s: float = 50e9
    link_latency_s: float = 0.0
    decode_router: object = None  # round robin when None


@dataclass
class SimResult:
    requests: list[RequestRecord]
    passes: list[PassRecord]
    num_passes: int  # passes simulated, fast-forwarded ones included
    wall_s: float
    end_s: float  # simulated time of the last event that mattered (last token or rejection)
    peak_kv_blocks: list[int] = field(default_factory=list)  # per replica
    num_steps: int = 0  # simulation steps: passes run one by one plus fast-forwarded runs
    prefix_hit_tokens: int = 0  # prompt tokens found in a prefix cache, not computed


def arrivals(env: simpy.Environment, trace: Trace, cluster: Cluster, keep_token_times: bool):
    """Each trace row becomes a request at its arrival time and goes to the cluster."""
    ids = trace.ids()
    prompt, output = trace.prompt_tokens.tolist(), trace.output_tokens.tolist()
    priority = trace.priority.tolist() if trace.priority is not None else None
    hashes = trace.block_hashes
    for i, t in enumerate(trace.arrival_s.tolist()):
        now = env.now
        if t > now:
            yield env.timeout(t - now)
        cluster.submit(Sequence(ids[i], t, prompt[i], output[i], priority[i] if priority else 0,
                                hashes[i] if hashes else None, keep_token_times, i))


def simulate(trace: Trace, make_scheduler: Callable[[], Scheduler], cost: CostModel, replicas: int = 1,
             router=None, *, disaggregate: Disaggregation | None = None, keep_token_times: bool = False,
             log_passes: bool = False, fast_forward: bool = True, run_id: str = "sim",
             swap_link: SwapLink | None = None, overlap: bool = False) -> SimResult:
    """Replay `trace` on `replicas` replicas (each with a fresh `make_scheduler()`) behind
    `router` (round robin by default), or on prefill and decode replicas when `disaggregate`.
    `swap_link` prices the copies of schedulers that preempt by swapping; `overlap` models the
    engine planning each pass while the one before it runs (see `sim.replica.Replica`)."""
    trace.check_arrivals()
    wall = time.perf_counter()
    env = simpy.Environment()
    log: list[PassRecord] | None = [] if log_passes else None

    def replica(index: int, scheduler: Scheduler) -> Replica:
        return Replica(env, index, scheduler, cost, fast_forward=fast_forward, pass_log=log, run_id=run_id,
                       swap_link=swap_link, overlap=overlap)

    router = router if router is not None else RoundRobin()
    if disaggregate is None:
        if replicas < 1:
            raise ValueError(f"need at least one replica, got {replicas}")
        cluster = Cluster([replica(i, make_scheduler()) for i in range(replicas)], router)
        members = cluster.replicas
    else:
        d = disaggregate
        prefill = [replica(i, make_scheduler()) for i in range(d.prefill_replicas)]
        decode = [replica(d.prefill_replicas + i, d.make_decode_scheduler()) for i in range(d.decode_replicas)]
        cluster = DisaggregatedCluster(env, prefill, decode, router, d.decode_router or RoundRobin(), d.kv_bytes_per_token,
                                       d.link_bytes_per_s, d.link_latency_s)
        members = prefill + decode
    env.process(arrivals(env, trace, cluster, keep_token_times))
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a run makes many objects and next to no reference cycles: collecting is wasted time
    try:
        env.run()
    finally:
        if gc_was_enabled:
            gc.enable()

    seqs = sorted(cluster.done, key=lambda s: s.index)
    if len(seqs) != len(trace):
        stuck = len(trace) - len(seqs)
        raise RuntimeError(f"{stuck} requests neither finished nor were rejected; the simulation stalled")
    end_s = max((s.finish_s if s.finish_s is not None else s.arrival_s) for s in seqs) if seqs else 0.0
    if log is not None:
        log.sort(key=lambda p: (p.start_s, p.replica))
    return SimResult(requests=[s.record(run_id) for s in seqs], passes=log or [],
                     num_passes=sum(r.num_passes for r in members), wall_s=time.perf_counter() - wall, end_s=end_s,
                     peak_kv_blocks=[r.scheduler.kv.peak_used for r in members],
                     num_steps=sum(r.num_steps for r in members),
                     prefix_hit_tokens=sum(getattr(r.scheduler.kv, "hit_tokens", 0) for r in members))
