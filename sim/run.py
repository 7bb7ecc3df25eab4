"""One simulated run: a trace's requests arrive, replicas serve them, records come out.

Following one request: `arrivals` turns its trace row into a `Sequence` at its arrival time and
submits it to the cluster, which rejects it (with the reason) or routes it to a replica; the
replica's loop (`sim.replica`) runs the passes its scheduler plans (`core.scheduler`) for the time
the cost model gives (`sim.cost`); when the sequence leaves, it becomes a row of the run's
`RequestTable` (its RequestRecord in columns) and is forgotten, and `core.metrics.compute_metrics`
turns the table into the metrics table.

Memory follows what is live, not what has passed: the trace may come a chunk at a time
(`traces.io.iter_trace`), the arrivals turn a few thousand rows at a time into Python values,
and a finished request keeps only its row (about 70 bytes; token times only when kept).
"""
from __future__ import annotations

import gc
import itertools
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import numpy as np
import simpy

from core.records import PassRecord, RequestRecord
from core.request_table import RequestTable, TableBuilder
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
    table: RequestTable  # the request records, in arrival order, as columns
    passes: list[PassRecord]
    num_passes: int  # passes simulated, fast-forwarded ones included
    wall_s: float
    end_s: float  # simulated time of the last event that mattered (last token or rejection)
    peak_kv_blocks: list[int] = field(default_factory=list)  # per replica
    num_steps: int = 0  # simulation steps: passes run one by one plus fast-forwarded runs
    prefix_hit_tokens: int = 0  # prompt tokens found in a prefix cache, not computed
    extrapolated: str | None = None  # passes the cost model priced beyond its calibration's shapes, in a sentence
    _records: list[RequestRecord] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def requests(self) -> list[RequestRecord]:
        """The request records as objects, made from `table` when first asked for (about a
        kilobyte a request: a long run's code should read `table`)."""
        if self._records is None:
            self._records = self.table.records()
        return self._records


ROWS_PER_PULL = 4096  # trace rows turned into Python values at a time


def arrivals(env: simpy.Environment, chunks: Iterable[Trace], cluster: Cluster, keep_token_times: bool,
             pulled: list[int]):
    """Each trace row becomes a request at its arrival time and goes to the cluster; rows are
    taken from the chunks as the clock reaches them. `pulled[0]` counts the rows taken."""
    index = 0
    for chunk in chunks:
        for lo in range(0, len(chunk), ROWS_PER_PULL):
            hi = min(lo + ROWS_PER_PULL, len(chunk))
            ids = chunk.request_id[lo:hi] if chunk.request_id is not None else \
                [str(i) for i in range(index + lo, index + hi)]
            prompt, output = chunk.prompt_tokens[lo:hi].tolist(), chunk.output_tokens[lo:hi].tolist()
            priority = chunk.priority[lo:hi].tolist() if chunk.priority is not None else None
            hashes = chunk.block_hashes[lo:hi] if chunk.block_hashes is not None else None
            first = index + lo
            for i, t in enumerate(chunk.arrival_s[lo:hi].tolist()):
                now = env.now
                if t > now:
                    yield env.timeout(t - now)
                wait = cluster.settle_s(env.now)  # a pass ending within a rounding of it ends first
                if wait is not None:
                    yield env.timeout(wait)
                cluster.submit(Sequence(ids[i], t, prompt[i], output[i], priority[i] if priority else 0,
                                        hashes[i] if hashes else None, keep_token_times, first + i))
            pulled[0] = index + hi
        index += len(chunk)


def checked_chunks(chunks: Iterable[Trace]) -> Iterator[Trace]:
    """`Trace.check_arrivals` on each chunk, and time order across them."""
    last = None
    for chunk in chunks:
        if not len(chunk):
            continue
        chunk.check_arrivals()
        if last is not None and chunk.arrival_s[0] < last:
            raise ValueError(f"{chunk.name}: arrivals must be in time order, but a chunk starts at "
                             f"{chunk.arrival_s[0]:g} s, before the last arrival of the one before, {last:g} s")
        last = chunk.arrival_s[-1]
        yield chunk


def simulate(trace: Trace | Iterable[Trace], make_scheduler: Callable[[], Scheduler], cost: CostModel,
             replicas: int = 1, router=None, *, disaggregate: Disaggregation | None = None,
             keep_token_times: bool = False, log_passes: bool = False, fast_forward: bool = True,
             run_id: str = "sim", swap_link: SwapLink | None = None, overlap: bool = False) -> SimResult:
    """Replay `trace` (a Trace, or its consecutive chunks, read as the run needs them) on
    `replicas` replicas (each with a fresh `make_scheduler()`) behind `router` (round robin by
    default), or on prefill and decode replicas when `disaggregate`. `swap_link` prices the
    copies of schedulers that preempt by swapping; `overlap` models the engine planning each pass
    while the one before it runs (see `sim.replica.Replica`)."""
    if isinstance(trace, Trace):
        trace.check_arrivals()
        chunks: Iterable[Trace] = (trace,)
        first, capacity = trace, len(trace)
    else:
        stream = checked_chunks(trace)
        first = next(stream, None)
        chunks, capacity = (itertools.chain([first], stream) if first is not None else ()), 1024
    wall = time.perf_counter()
    if hasattr(cost, "extrapolated"):  # (a calibrated model counts what this run prices beyond its sweep)
        cost.extrapolated.clear()
    env = simpy.Environment()
    log: list[PassRecord] | None = [] if log_passes else None
    rows = TableBuilder(run_id, keep_token_times, ids=first is not None and first.request_id is not None,
                        capacity=capacity)

    def replica(index: int, scheduler: Scheduler) -> Replica:
        return Replica(env, index, scheduler, cost, fast_forward=fast_forward, pass_log=log, run_id=run_id,
                       swap_link=swap_link, overlap=overlap, host=getattr(cost, "host", None))

    router = router if router is not None else RoundRobin()
    if disaggregate is None:
        if replicas < 1:
            raise ValueError(f"need at least one replica, got {replicas}")
        cluster = Cluster([replica(i, make_scheduler()) for i in range(replicas)], router, rows.add)
        members = cluster.replicas
    else:
        d = disaggregate
        prefill = [replica(i, make_scheduler()) for i in range(d.prefill_replicas)]
        decode = [replica(d.prefill_replicas + i, d.make_decode_scheduler()) for i in range(d.decode_replicas)]
        cluster = DisaggregatedCluster(env, prefill, decode, router, d.decode_router or RoundRobin(),
                                       d.kv_bytes_per_token, rows.add, d.link_bytes_per_s, d.link_latency_s)
        members = prefill + decode
    pulled = [0]
    env.process(arrivals(env, chunks, cluster, keep_token_times, pulled))
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a run makes many objects and next to no reference cycles: collecting is wasted time
    try:
        env.run()
    finally:
        if gc_was_enabled:
            gc.enable()

    table = rows.table()
    if len(table) != pulled[0] or rows.count != pulled[0]:
        stuck = pulled[0] - rows.count
        raise RuntimeError(f"{stuck} requests neither finished nor were rejected; the simulation stalled")
    end_s = float(np.fmax(table.finish_s, table.arrival_s).max()) if len(table) else 0.0
    if log is not None:
        log.sort(key=lambda p: (p.start_s, p.replica))
    return SimResult(table=table, passes=log or [],
                     num_passes=sum(r.num_passes for r in members), wall_s=time.perf_counter() - wall, end_s=end_s,
                     peak_kv_blocks=[r.scheduler.kv.peak_used for r in members],
                     num_steps=sum(r.num_steps for r in members),
                     prefix_hit_tokens=sum(getattr(r.scheduler.kv, "hit_tokens", 0) for r in members),
                     extrapolated=cost.extrapolation() if hasattr(cost, "extrapolation") else None)
