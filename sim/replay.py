"""The simulator driven by an engine run's own pass times: do its schedules then coincide?

`replay_schedule` replays a run's requests through the simulator's replica (the same scheduler
code, the same overlap rule) with every pass timed as the engine's was: pass i starts when the
engine's pass i started and ends when the engine's next pass started (a pass before which the
engine slept for lack of work ends when its own time says). If the simulator's loop does what
the engine's loop (`engine.continuous.serve`) does, pass i has the engine's pass i's shape
(sequences, new tokens, cached context) for every i; the first pass where it does not is the
first divergence, and what differs there says which behaviour the simulator lacks. Only the
time, not the cost model, is taken from the run, so a divergence is behaviour, not cost.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.records import PassRecord, RequestRecord


class Diverged(Exception):
    """The simulator planned pass `index` differently from the engine."""

    def __init__(self, index: int, sim: tuple, real: tuple):
        super().__init__(index, sim, real)
        self.index, self.sim, self.real = index, sim, real


class MeasuredPasses:
    """A cost model (`sim.cost` interface) and host (`sim.host` interface) that time pass i as
    the engine's pass i ran, and check its shape. Single replica, stepped pass by pass."""

    zero = False  # (as a host: never "no host time")
    retire_s = 0.0  # (as a host: set to the measured lag to replay with it)

    def __init__(self, passes: list[PassRecord], arrivals: list[float]):
        self.passes = passes
        self.index = 0
        self.prev_end = 0.0
        starts = np.array([p.start_s for p in passes])
        ends = starts + np.array([p.duration_s for p in passes])
        arrivals = np.sort(np.asarray(arrivals, float))
        # the engine slept before pass i+1 when a request arrived after pass i ended and before
        # pass i+1 started; otherwise the time between them was the engine's (host, records)
        self.slept = np.zeros(len(passes), bool)
        if len(passes) > 1:
            first_after = np.searchsorted(arrivals, ends[:-1], side="right")
            self.slept[1:] = (first_after < len(arrivals)) & \
                (arrivals[np.minimum(first_after, len(arrivals) - 1)] <= starts[1:])
        self.starts, self.ends = starts, ends

    @property
    def host(self) -> "MeasuredPasses":
        return self

    def pass_time(self, new_tokens, context_lens) -> float:
        i = self.index
        if i >= len(self.passes):
            raise Diverged(i, (list(new_tokens), list(context_lens)), None)
        p = self.passes[i]
        if list(new_tokens) != list(p.new_tokens) or list(context_lens) != list(p.context_lens):
            raise Diverged(i, (list(new_tokens), list(context_lens)), (list(p.new_tokens), list(p.context_lens)))
        self.index += 1
        if i + 1 < len(self.passes) and not self.slept[i + 1]:
            duration = self.starts[i + 1] - self.starts[i]
        else:
            duration = p.duration_s
        self.prev_end = self.starts[i] + duration
        return duration

    def decode_line(self, batch_size, context_sum, context_max=None):
        return None

    def launch_time(self, plan) -> float:
        """The engine's own time building and launching this pass (its logged host and launch time)."""
        if self.index >= len(self.passes):
            return 0.0
        p = self.passes[self.index]
        return (p.host_s or 0.0) + (p.launch_s or 0.0)

    def idle_delay(self, plan, woke: bool) -> float:
        """From the simulator's planning moment (the later of the last pass's end and the
        newest arrival in the plan) to the engine's start of this pass."""
        i = self.index
        if i >= len(self.passes):
            return 0.0
        planned = max([self.prev_end] + [s.arrival_s for s in plan.seqs])
        return max(0.0, self.starts[i] - planned)


@dataclass
class ReplayResult:
    passes: int             # engine passes
    matched: int            # passes the simulator planned identically, from the first
    divergence: Diverged | None

    @property
    def coincide(self) -> bool:
        return self.divergence is None and self.matched == self.passes


def replay_schedule(row: dict, requests: list[RequestRecord], passes: list[PassRecord],
                    retire_s: float = 0.0) -> ReplayResult:
    """Replay one single-replica engine run (its runs.jsonl row, requests and passes) with the
    engine's own pass times; how many passes, from the first, the simulator planned alike
    (`retire_s`: the host's lag after a pass ends before its next plan reads arrivals, `sim.host`)."""
    from sim.compare import simulate_like

    if (row.get("replicas") or 1) != 1:
        raise ValueError(f"{row['run_id']}: a replay of pass times needs a single-replica run")
    measured = MeasuredPasses(passes, [r.arrival_s for r in requests])
    measured.retire_s = retire_s
    try:
        simulate_like(row, requests, measured, fast_forward=False)
    except Diverged as d:
        return ReplayResult(len(passes), d.index, d)
    return ReplayResult(len(passes), measured.index, None)
