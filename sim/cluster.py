"""Replicas behind a router, and prefill/decode disaggregation.

A router (`core.routers`, the same code the real multi-replica engine uses) picks a replica
for each arriving request from what the replicas show at that moment. `Cluster` routes every request to one replica; `DisaggregatedCluster` computes prompts
on prefill replicas, moves each prompt's KV cache over a link, and decodes on decode replicas.
"""
from __future__ import annotations

from typing import Callable

import simpy

from core.routers import RoundRobin
from core.scheduler import Sequence
from sim.replica import Replica, settle_s


class Cluster:
    """Replicas behind a router; hands every request to `sink` once it has left (finished or
    rejected), and forgets it."""

    def __init__(self, replicas: list[Replica], router, sink: Callable[[Sequence], None]):
        self.replicas = replicas
        self.router = router
        self.done = sink
        for r in replicas:
            r.on_leave = self.leave

    def settle_s(self, now: float) -> float | None:
        """How long an arrival at `now` waits so that the router reads the replicas after any pass
        ending within a float rounding of it (`sim.replica.settle_s`)."""
        return settle_s(self.replicas, now)

    def submit(self, seq: Sequence) -> None:
        """An arriving request goes to the replica the router picks, which queues it or
        rejects it with the reason (it would never fit)."""
        replica = self.router.pick(self.replicas, seq)
        seq.replica = replica.index
        if replica.add(seq) is not None:
            self.done(seq)

    def leave(self, seq: Sequence, replica: Replica) -> None:
        self.done(seq)


class DisaggregatedCluster(Cluster):
    """Prefill replicas and decode replicas (DistServe, Splitwise). A prompt is computed on a
    prefill replica (which produces the first token), its cache is sent to a decode replica in
    `link_latency_s + tokens * kv_bytes_per_token / link_bytes_per_s` seconds (transfers don't
    contend for the link), and the prefill replica frees it once sent."""

    def __init__(self, env: simpy.Environment, prefill: list[Replica], decode: list[Replica],
                 prefill_router, decode_router, kv_bytes_per_token: int, sink: Callable[[Sequence], None],
                 link_bytes_per_s: float = 50e9, link_latency_s: float = 0.0):
        if not prefill or not decode:
            raise ValueError("disaggregation needs at least one prefill and one decode replica")
        if link_bytes_per_s <= 0:
            raise ValueError(f"link bandwidth must be positive, got {link_bytes_per_s}")
        super().__init__(prefill, prefill_router, sink)
        self.env = env
        self.decode = decode
        self.decode_router = decode_router
        self.kv_bytes_per_token = kv_bytes_per_token
        self.link_bytes_per_s = link_bytes_per_s
        self.link_latency_s = link_latency_s
        for r in prefill:
            r.scheduler.prefill_only = True
        for r in decode:
            r.on_leave = self.leave

    def submit(self, seq: Sequence) -> None:
        reason = self.decode[0].scheduler.check(seq)
        if reason is not None:
            seq.rejected = reason
            self.done(seq)
            return
        super().submit(seq)

    def leave(self, seq: Sequence, replica: Replica) -> None:
        if seq.finish_s is not None:
            self.done(seq)
        else:
            self.env.process(self.transfer(seq, replica))

    def transfer(self, seq: Sequence, source: Replica):
        """The prompt's cache crosses the link; then the request decodes on a decode replica."""
        yield self.env.timeout(self.link_latency_s + seq.num_computed * self.kv_bytes_per_token / self.link_bytes_per_s)
        source.scheduler.release(seq)
        source.notify()
        wait = settle_s(self.decode, self.env.now)
        if wait is not None:
            yield self.env.timeout(wait)
        target = self.decode_router.pick(self.decode, seq)
        seq.replica = target.index
        target.add(seq)
