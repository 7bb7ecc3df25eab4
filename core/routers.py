"""Routers: which replica an arriving request goes to, from what the replicas show right now.

Pure Python, shared by the simulated cluster (`sim.cluster`) and the real multi-replica engine
(`engine.cluster`). A replica is anything with

    index: int               its number
    num_outstanding: int     requests sent to it and not finished (waiting or running)
    kv_load: float           KV blocks in use plus those its waiting prompts will need, as a
                             fraction of its cache

and a router is an object with `pick(replicas, request) -> replica`.
"""
from __future__ import annotations

import random
from typing import Protocol, Sequence


class ReplicaView(Protocol):
    index: int

    @property
    def num_outstanding(self) -> int: ...

    @property
    def kv_load(self) -> float: ...


class RoundRobin:
    """Each replica in turn."""

    def __init__(self):
        self.next = 0

    def pick(self, replicas: Sequence[ReplicaView], request=None) -> ReplicaView:
        replica = replicas[self.next % len(replicas)]
        self.next += 1
        return replica


class LeastOutstanding:
    """The replica with the fewest requests waiting or running (lowest index on ties)."""

    def pick(self, replicas: Sequence[ReplicaView], request=None) -> ReplicaView:
        return min(replicas, key=lambda r: r.num_outstanding)


class LeastKVLoad:
    """The replica whose KV cache is least loaded, counting what its waiting prompts will need."""

    def pick(self, replicas: Sequence[ReplicaView], request=None) -> ReplicaView:
        return min(replicas, key=lambda r: r.kv_load)


class PowerOfTwo:
    """Two replicas drawn at random (seeded); the one with fewer outstanding requests
    (Mitzenmacher's power of two choices)."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    def pick(self, replicas: Sequence[ReplicaView], request=None) -> ReplicaView:
        if len(replicas) == 1:
            return replicas[0]
        a, b = self.rng.sample(replicas, 2)
        return min((a, b), key=lambda r: (r.num_outstanding, r.index))


ROUTERS = {
    "round-robin": RoundRobin,
    "least-outstanding": LeastOutstanding,
    "least-kv": LeastKVLoad,
    "power-of-two": PowerOfTwo,
}


def make_router(name: str, seed: int = 0):
    """A router by its CLI name; only power-of-two draws anything, from `seed`."""
    if name not in ROUTERS:
        raise ValueError(f"unknown router {name!r}; choose from {', '.join(ROUTERS)}")
    return PowerOfTwo(seed) if name == "power-of-two" else ROUTERS[name]()
