"""The engine's host: the time between an idle engine deciding to run a pass and the pass ending
later than its GPU time says.

The continuous engine (`engine.continuous.serve`) plans and launches a pass on the CPU. While
the GPU is busy that time is hidden (overlap: the next pass is launched while the current one
runs). A pass launched onto an idle GPU is not: it starts after the host has planned it and
built its batch, and its launch (copying the batch in, launching the graph) shows up in its
time. An engine that had nothing to do also sleeps, and notices an arrival a little late.
Measured on the committed H200 pass logs by `python -m calibrate.host`, stored in the
calibration file's optional "host" field (all zero when absent):

    delay = max(fixed_s, per_token_s * tokens of the pass)   (+ wake_s if the engine had been sleeping)

(the measured delay is flat up to a few thousand tokens, then grows with the batch the host
builds: 7.9 ms for 256 prompts of 256 tokens at once).

`sim.replica.Replica` starts such a pass `delay` seconds after it planned it. Passes planned
while another one runs pay nothing (the engine's host works in the GPU's shadow). With overlap,
the plan made while pass k+1 runs is made once the host has read pass k's tokens, `retire_s`
after pass k ended, and once it has built and launched pass k+1: `launch_s` after planning it,
or `eager_launch_s` for a pass of more than `graph_tokens` tokens, which runs without a CUDA
graph, its kernels launched one by one (14.6 ms at the median on the H200's host, against 0.4 ms
for a graph). Requests that arrived by then join it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

from core.scheduler import ScheduledPass

MAX_HOST_S = 1.0  # a host term of a second or more is a broken file, not a host


def real(v) -> bool:
    """A finite int or float (not a bool): what a calibration section's numbers must be."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def optional_section(cls, d, name: str, source: str):
    """An optional section `name` of a calibration file (`d`, None when absent: all defaults) as
    the frozen dataclass `cls`, which checks its values; a section that is not an object of
    `cls`'s fields is an error naming it."""
    if d is None:
        return cls()
    if not isinstance(d, dict):
        raise ValueError(f"{source}: {name} must be an object, got {d!r}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"{source}: {name} has unknown keys {unknown}; known: {sorted(known)}")
    try:
        return cls(**d)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


@dataclass(frozen=True)
class HostTime:
    fixed_s: float = 0.0        # plan, build and launch a pass onto an idle GPU
    per_token_s: float = 0.0    # ... or, for a large pass, this much per token it puts through
    wake_s: float = 0.0         # a sleeping engine's lag in noticing an arrival
    retire_s: float = 0.0       # after a pass ends, how long the plan after next still sees arrivals
    launch_s: float = 0.0       # overlap: from planning a pass to the host's next plan (build, launch a graph)
    eager_launch_s: float = 0.0  # ... for a pass of more than graph_tokens tokens (no graph)
    graph_tokens: int = 0       # the most tokens a pass runs as a CUDA graph (0: every pass does)

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "graph_tokens":
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise ValueError(f"host.graph_tokens must be a whole number of tokens >= 0, got {v!r}")
                continue
            if not real(v) or not 0 <= v < MAX_HOST_S:
                raise ValueError(f"host.{f.name} must be a number of seconds from 0 to {MAX_HOST_S:g}, got {v!r}")

    @classmethod
    def from_dict(cls, d, source: str = "calibration") -> "HostTime":
        """The calibration file's "host" field (None: no host time)."""
        return optional_section(cls, d, "host", source)

    @property
    def zero(self) -> bool:
        return not (self.fixed_s or self.per_token_s or self.wake_s or self.retire_s or self.launch_s
                    or self.eager_launch_s)

    def idle_delay(self, plan: ScheduledPass, woke: bool) -> float:
        """Seconds from planning `plan` on an idle engine to its start, as far as its end is
        concerned (`woke`: the engine had been sleeping for lack of work)."""
        return max(self.fixed_s, self.per_token_s * sum(plan.new_tokens)) + (self.wake_s if woke else 0.0)

    def launch_time(self, plan: ScheduledPass) -> float:
        """Seconds the host spends building and launching `plan` before it can plan again."""
        if self.graph_tokens and sum(plan.new_tokens) > self.graph_tokens:
            return self.eager_launch_s
        return self.launch_s

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
