"""How much recent prompt work slows the GPU's next passes.

Measured on the H200 by design (`python -m calibrate heat`, `results/calibration`): prompt
passes run near the card's arithmetic peak, and its power limit (700 W): after some tens of
milliseconds of them nvidia-smi shows the SM clock pulled down from 1,980 to 1,400-1,600 MHz
(reason: software power cap). Back-to-back prompt passes of 4,096 tokens ran 21.8 ms rested,
then slower pass by pass to about +11% by the fourth or fifth; decode passes just after ran
about 7% slower and recovered within 50-100 ms. The model: a level h between 0 (rested) and
1 (after long prompt work) that rises during passes of prompt tokens only (`heats`) and falls
during the others and while idle,

    dh/dt = (1 - h) / tau_up_s   during such a pass,    dh/dt = -h / tau_s   otherwise,

and a pass takes (1 + kappa * the mean of h over its own run) times its rested time, with one
kappa for passes of prompt tokens only (`prefill`) and one for the others (`decode`, mixed
passes included). The mean over the pass's run matters for long passes: one of 65,536 tokens
(0.3 s) from rest spends most of its time throttled; h at its start alone had priced the closed
runs' large first passes 5-8% short. Stored in the calibration file's optional "heat" field
(none: no effect); tau_up_s 0 (older files) means tau_s.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from sim.host import optional_section

MAX_TAU_S = 10.0


def heats(new_tokens) -> bool:
    """A pass of prompt tokens only (prompts or chunks, no decodes): one that runs near the card's
    arithmetic peak. Mixed passes (a chunk beside decodes) count as decode passes: chunked
    prefill's, a chunk beside many decodes in every pass, did not slow the H200 down."""
    return all(n > 1 for n in new_tokens)


@dataclass(frozen=True)
class Heat:
    decode: float = 0.0    # a decode pass's slow-down after long prompt work (0.1: 10% longer)
    prefill: float = 0.0   # ... a pass of prompt tokens only
    tau_s: float = 0.0     # how fast the level falls (other passes, idle), seconds
    tau_up_s: float = 0.0  # how fast it rises during prompt passes, seconds (0: tau_s)

    def __post_init__(self) -> None:
        for name, high in (("decode", 1.0), ("prefill", 1.0), ("tau_s", MAX_TAU_S), ("tau_up_s", MAX_TAU_S)):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or not 0 <= v <= high:
                raise ValueError(f"heat.{name} must be a number from 0 to {high:g}, got {v!r}")
        if (self.decode or self.prefill) and not self.tau_s:
            raise ValueError("heat.tau_s must be above 0 when heat.decode or heat.prefill is")

    @classmethod
    def from_dict(cls, d, source: str = "calibration") -> "Heat":
        """The calibration file's "heat" field (None: no effect)."""
        return optional_section(cls, d, "heat", source)

    @property
    def zero(self) -> bool:
        return not (self.decode or self.prefill)

    @property
    def rise_s(self) -> float:
        return self.tau_up_s or self.tau_s

    def as_dict(self) -> dict:
        return {"decode": self.decode, "prefill": self.prefill, "tau_s": self.tau_s, "tau_up_s": self.rise_s}


class HeatState:
    """The level h over one GPU's passes, fed in time order."""

    def __init__(self, heat: Heat):
        self.heat = heat
        self.level = 0.0   # h at time `at`
        self.at = 0.0

    def value(self, t: float) -> float:
        """h at time t (no prompt pass since `at`)."""
        if not self.heat.tau_s or t <= self.at:
            return self.level
        return self.level * math.exp(-(t - self.at) / self.heat.tau_s)

    def mean(self, start: float, duration: float, prefill: bool) -> float:
        """The mean of h over a pass from `start` for `duration` seconds."""
        h = self.value(start)
        tau = self.heat.rise_s if prefill else self.heat.tau_s
        if duration <= 0 or not tau:
            return h
        w = tau / duration * (1.0 - math.exp(-duration / tau))  # the mean of e^(-t/tau) over the pass
        return 1.0 + (h - 1.0) * w if prefill else h * w

    def factor(self, t: float, prefill: bool = False, duration: float = 0.0) -> float:
        """A pass starting at t and running `duration` seconds (of prompt tokens only or not)
        takes this many times its rested time: 1 + kappa * the mean of h over it."""
        kappa = self.heat.prefill if prefill else self.heat.decode
        if not kappa:
            return 1.0
        return 1.0 + kappa * self.mean(t, duration, prefill)

    def slowed(self, start: float, rested: float, prefill: bool) -> float:
        """The time of a pass that takes `rested` seconds rested, starting at `start` (its factor
        depends on its own length: two substitutions, well within 0.1%)."""
        duration = rested
        for _ in range(2):
            duration = rested * self.factor(start, prefill, duration)
        return duration

    def mean_factor(self, start: float, duration: float) -> float:
        """The mean factor of decode passes from `start` for `duration` seconds (the simulator's
        fast-forward prices a run of decode passes at it: their total time is right, the first
        are a little short and the last a little long)."""
        return self.factor(start, False, duration)

    def passed(self, start: float, duration: float, prefill: bool) -> None:
        """A pass ran from start for duration seconds (of prompt tokens only or not)."""
        if not self.heat.tau_s:
            return
        h = self.value(start)
        if prefill:
            h = 1.0 + (h - 1.0) * math.exp(-duration / self.heat.rise_s)
        else:
            h *= math.exp(-duration / self.heat.tau_s)
        self.level, self.at = h, start + duration


def levels(passes, tau_s: float, tau_up_s: float = 0.0) -> list[float]:
    """The mean of h over every pass of a logged run (PassRecords, any order; each replica's GPU
    on its own; each pass over its logged time), for a level falling with `tau_s` and rising
    with `tau_up_s` (0: tau_s)."""
    states: dict = {}
    out = {}
    shape = Heat(tau_s=tau_s, tau_up_s=tau_up_s)
    for p in sorted(passes, key=lambda p: p.start_s):
        state = states.setdefault(getattr(p, "replica", 0), HeatState(shape))
        prefill = heats(p.new_tokens)
        out[id(p)] = state.mean(p.start_s, p.duration_s, prefill)
        state.passed(p.start_s, p.duration_s, prefill)
    return [out[id(p)] for p in passes]


def factors(passes, heat: Heat) -> list[float]:
    """The factor of every pass of a logged run (as `levels`)."""
    if heat.zero:
        return [1.0] * len(passes)
    return [1.0 + (heat.prefill if heats(p.new_tokens) else heat.decode) * h
            for p, h in zip(passes, levels(passes, heat.tau_s, heat.tau_up_s))]


def logged_times(cost, passes) -> list[float]:
    """Every logged pass priced as the simulator runs it: `cost`'s pass time, times the factor
    of the heat the cost model carries (if any)."""
    heat = getattr(cost, "heat", None) or Heat()
    return [cost.pass_time(p.new_tokens, p.context_lens) * f for p, f in zip(passes, factors(passes, heat))]
