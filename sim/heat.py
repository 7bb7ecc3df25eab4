"""How much recent prompt work slows the GPU's next passes.

Measured on the H200 (`results/calibration`): a pass that starts just after a long prefill pass
(prompts run near the card's arithmetic peak, and its power limit) runs several percent slower
than the same pass after a rest, and the card recovers over some tens of milliseconds; in the
open Azure runs at 32x the decode passes within 1 ms of a prefill ran 10% longer than the
calibration said, those 0.1-1 s after one 3% shorter, and prefill passes that followed prefill
for a while 7.6% longer. The model: a leaky integrator of the seconds spent in passes of prompt
tokens only (`heats`),

    dH/dt = [such a pass is running] - H / tau_s

and a pass that starts when the integrator holds H takes (1 + kappa * H / tau_s) times its
rested time, with one kappa for passes of prompt tokens only (`prefill`) and one for the others
(`decode`, mixed passes included); H / tau_s is between 0, rested, and 1, after prefill for much
longer than tau_s. They are fitted with the cost model (`calibrate.heat`) on the sweep's own
pass stream, and stored in the calibration file's optional "heat" field (none: no effect).
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
    decode: float = 0.0    # a decode pass's slow-down after a long prefill (0.1: 10% longer)
    prefill: float = 0.0   # ... a pass that carries prompt tokens
    tau_s: float = 0.0     # how fast the integrator leaks, seconds

    def __post_init__(self) -> None:
        for name, high in (("decode", 1.0), ("prefill", 1.0), ("tau_s", MAX_TAU_S)):
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

    def as_dict(self) -> dict:
        return {"decode": self.decode, "prefill": self.prefill, "tau_s": self.tau_s}


class HeatState:
    """The integrator over one GPU's passes, fed in time order."""

    def __init__(self, heat: Heat):
        self.heat = heat
        self.level = 0.0   # H, seconds, at time `at`
        self.at = 0.0

    def value(self, t: float) -> float:
        """H at time t (no prefill since `at`)."""
        if not self.heat.tau_s or t <= self.at:
            return self.level
        return self.level * math.exp(-(t - self.at) / self.heat.tau_s)

    def factor(self, t: float, prefill: bool = False) -> float:
        """A pass starting at t (carrying prompt tokens or not) takes this many times its rested time."""
        kappa = self.heat.prefill if prefill else self.heat.decode
        if not kappa:
            return 1.0
        return 1.0 + kappa * self.value(t) / self.heat.tau_s

    def mean_factor(self, start: float, duration: float) -> float:
        """The mean factor of decode passes from `start` for `duration` seconds (the simulator's
        fast-forward prices a run of decode passes at it: their total time is right, the first
        are a little short and the last a little long)."""
        if not self.heat.decode or duration <= 0:
            return self.factor(start)
        # the mean of 1 + decode * H(t) / tau over the run, H decaying from H(start) with tau
        return 1.0 + self.heat.decode * self.value(start) / duration * (1.0 - math.exp(-duration / self.heat.tau_s))

    def passed(self, start: float, duration: float, prefill: bool) -> None:
        """A pass ran from start for duration seconds (carrying prompt tokens or not)."""
        if not self.heat.tau_s:
            return
        tau = self.heat.tau_s
        level = self.value(start)
        if prefill:
            decay = math.exp(-duration / tau)
            level = level * decay + tau * (1.0 - decay)
        else:
            level *= math.exp(-duration / tau)
        self.level, self.at = level, start + duration


def levels(passes, tau_s: float) -> list[float]:
    """H / tau_s at the start of every pass of a logged run (PassRecords, any order; each
    replica's GPU on its own), for an integrator leaking with `tau_s`."""
    states: dict = {}
    out = {}
    for p in sorted(passes, key=lambda p: p.start_s):
        state = states.setdefault(getattr(p, "replica", 0), HeatState(Heat(tau_s=tau_s)))
        out[id(p)] = state.value(p.start_s) / tau_s
        state.passed(p.start_s, p.duration_s, heats(p.new_tokens))
    return [out[id(p)] for p in passes]


def factors(passes, heat: Heat) -> list[float]:
    """The factor of every pass of a logged run (as `levels`)."""
    if heat.zero:
        return [1.0] * len(passes)
    return [1.0 + (heat.prefill if heats(p.new_tokens) else heat.decode) * h
            for p, h in zip(passes, levels(passes, heat.tau_s))]


def logged_times(cost, passes) -> list[float]:
    """Every logged pass priced as the simulator runs it: `cost`'s pass time, times the factor
    of the heat the cost model carries (if any)."""
    heat = getattr(cost, "heat", None) or Heat()
    return [cost.pass_time(p.new_tokens, p.context_lens) * f for p, f in zip(passes, factors(passes, heat))]
