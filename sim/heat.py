"""How much recent work at the card's power limit slows the GPU's next passes.

Measured on the H200 by design (`python -m calibrate heat`, `results/calibration`): passes of
many tokens (long prompts, chunks of 2,048 tokens with or without decodes beside them) run near
the card's arithmetic peak and its power limit (700 W): after some tens of milliseconds of them
nvidia-smi shows the SM clock pulled down from 1,980 to 1,400-1,600 MHz (reason: software power
cap). Back-to-back prompt passes of 4,096 tokens ran 21.9 ms rested, then slower pass by pass to
about +10% by the fourth to sixth; decode passes just after ran 6-7% slower and recovered within
50-100 ms; prompts of 512 tokens, back to back, settled 2.5-3.7% slower.

The model: a level h between 0 (rested) and 1 (at the power limit for long) that moves towards
the load u of the pass running (u = min(1, P / full_tokens) * P / (P + decode_weight * D) for P
prompt or chunk tokens and D decodes beside them: the share of the power limit the pass draws,
decode tokens not counted and each decode beside a chunk diluting it, since the heat runs'
mixed passes of a 2,048-token chunk slowed 6-7% beside 256 decodes and 8-10% beside 64; 0 while
idle), rising with tau_up_s and falling with tau_s,

    dh/dt = (u - h) / tau_up_s  when u > h,      (u - h) / tau_s  otherwise,

and a pass takes (1 + kappa(u) * the mean of h over its own run) times its rested time, kappa(u)
= decode + (prefill - decode) * u: a pass of few tokens (memory-bound) slows as decode passes
do, one at full load as prompt passes do. The mean over the pass's own run matters for long
passes: one of 65,536 tokens (0.37 s) from rest spends most of its time throttled. Stored in the
calibration file's optional "heat" field (none: no effect). Older files: tau_up_s 0 means tau_s,
full_tokens 0 means the load is 1 for a pass of prompt tokens only and 0 for any other, and no
decode_weight means decodes do not dilute the load.

A mixed pass (prompt tokens beside decodes, as chunked prefill runs them) slows by its own
`mixed` where the file gives one (`calibrate fit --serving-heat`: the slow-downs refitted on the
engine's open runs, where mixed passes slowed 5-6% at a level prompt passes slowed 17% at);
without it by kappa(u) like any other pass.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from core.records import pass_kind
from sim.host import optional_section, real

MAX_TAU_S = 10.0
MAX_DECODE_WEIGHT = 1e6  # tokens a decode beside a chunk counts as, at most


def heats(new_tokens) -> bool:
    """A pass of prompt tokens only (prompts or chunks, no decodes): the passes that load the card
    fully under the rule of older calibration files (full_tokens 0)."""
    return all(n > 1 for n in new_tokens)


@dataclass(frozen=True)
class Heat:
    decode: float = 0.0    # a pass of few tokens: its slow-down at h = 1 (0.1: 10% longer)
    prefill: float = 0.0   # ... a pass at full load
    tau_s: float = 0.0     # how fast the level falls (lighter passes, idle), seconds
    tau_up_s: float = 0.0  # how fast it rises, seconds (0: tau_s)
    full_tokens: int = 0   # a pass of this many tokens loads the card fully, fewer in proportion (0: see heats)
    decode_weight: float = 0.0  # in a pass of prompt tokens, each decode beside them dilutes the load as this many tokens
    mixed: float | None = None  # a pass of prompt tokens beside decodes: its slow-down at h = 1 (None: kappa(u))

    def __post_init__(self) -> None:
        for name, high in (("decode", 1.0), ("prefill", 1.0), ("tau_s", MAX_TAU_S), ("tau_up_s", MAX_TAU_S),
                           ("decode_weight", MAX_DECODE_WEIGHT)):
            v = getattr(self, name)
            if not real(v) or not 0 <= v <= high:
                raise ValueError(f"heat.{name} must be a number from 0 to {high:g}, got {v!r}")
        if self.mixed is not None and (not real(self.mixed) or not 0 <= self.mixed <= 1.0):
            raise ValueError(f"heat.mixed must be a number from 0 to 1 (or absent), got {self.mixed!r}")
        if not isinstance(self.full_tokens, int) or isinstance(self.full_tokens, bool) or self.full_tokens < 0:
            raise ValueError(f"heat.full_tokens must be a whole number of tokens >= 0, got {self.full_tokens!r}")
        if not self.zero and not self.tau_s:
            raise ValueError("heat.tau_s must be above 0 when heat.decode, heat.prefill or heat.mixed is")

    @classmethod
    def from_dict(cls, d, source: str = "calibration") -> "Heat":
        """The calibration file's "heat" field (None: no effect)."""
        return optional_section(cls, d, "heat", source)

    @property
    def zero(self) -> bool:
        return not (self.decode or self.prefill or self.mixed)

    @property
    def rise_s(self) -> float:
        return self.tau_up_s or self.tau_s

    def load(self, new_tokens) -> float:
        """u of a pass with these new tokens per sequence: its prompt tokens (the sequences' with more
        than one) over full_tokens (decode tokens do not count: the heat run's sustained decode
        passes did not heat the card), diluted by the decodes beside them (decode_weight tokens each)."""
        if not self.full_tokens:
            return 1.0 if heats(new_tokens) else 0.0
        prompt = sum(n for n in new_tokens if n > 1)
        u = min(1.0, prompt / self.full_tokens)
        if u and self.decode_weight:
            u *= prompt / (prompt + self.decode_weight * sum(1 for n in new_tokens if n == 1))
        return u

    def kappa(self, u: float) -> float:
        return self.decode + (self.prefill - self.decode) * u

    def kappa_of(self, new_tokens, context_lens) -> float:
        """The slow-down at h = 1 of a pass with these new tokens and cached contexts per sequence:
        `mixed` for a mixed pass (`core.records.pass_kind`: prompt tokens beside decodes, as the cost
        model's mixed form takes them) where it is given, else kappa of its load."""
        if self.mixed is not None and pass_kind(new_tokens, context_lens) == "mixed":
            return self.mixed
        return self.kappa(self.load(new_tokens))

    def as_dict(self) -> dict:
        d = {"decode": self.decode, "prefill": self.prefill, "tau_s": self.tau_s, "tau_up_s": self.rise_s,
             "full_tokens": self.full_tokens, "decode_weight": self.decode_weight}
        return d if self.mixed is None else d | {"mixed": self.mixed}


class HeatState:
    """The level h over one GPU's passes, fed in time order."""

    def __init__(self, heat: Heat):
        self.heat = heat
        self.level = 0.0   # h at time `at`
        self.at = 0.0

    def value(self, t: float) -> float:
        """h at time t (idle since `at`)."""
        if not self.heat.tau_s or t <= self.at:
            return self.level
        return self.level * math.exp(-(t - self.at) / self.heat.tau_s)

    def _tau(self, h: float, u: float) -> float:
        return self.heat.rise_s if u > h else self.heat.tau_s

    def mean(self, start: float, duration: float, u: float) -> float:
        """The mean of h over a pass of load u from `start` for `duration` seconds."""
        h = self.value(start)
        tau = self._tau(h, u)
        if duration <= 0 or not tau:
            return h
        w = tau / duration * (1.0 - math.exp(-duration / tau))  # the mean of e^(-t/tau) over the pass
        return u + (h - u) * w

    def factor(self, t: float, u: float = 0.0, duration: float = 0.0, kappa: float | None = None) -> float:
        """A pass of load u starting at t and running `duration` seconds takes this many times its
        rested time: 1 + kappa * the mean of h over it (kappa: the pass's `Heat.kappa_of`; None:
        kappa(u))."""
        if kappa is None:
            kappa = self.heat.kappa(u)
        if not kappa:
            return 1.0
        return 1.0 + kappa * self.mean(t, duration, u)

    def slowed(self, start: float, rested: float, u: float, kappa: float | None = None) -> float:
        """The time of a pass of load u that takes `rested` seconds rested, starting at `start` (its
        factor depends on its own length: two substitutions, well within 0.1%)."""
        duration = rested
        for _ in range(2):
            duration = rested * self.factor(start, u, duration, kappa)
        return duration

    def passed(self, start: float, duration: float, u: float) -> None:
        """A pass of load u ran from start for duration seconds."""
        if not self.heat.tau_s:
            return
        h = self.value(start)
        tau = self._tau(h, u)
        self.level, self.at = u + (h - u) * math.exp(-duration / tau), start + duration


def levels(passes, heat: Heat) -> list[float]:
    """The mean of h over every pass of a logged run (PassRecords, any order; each replica's GPU
    on its own; each pass over its logged time), for `heat`'s time constants and loads."""
    states: dict = {}
    out = {}
    for p in sorted(passes, key=lambda p: p.start_s):
        state = states.setdefault(getattr(p, "replica", 0), HeatState(heat))
        u = heat.load(p.new_tokens)
        out[id(p)] = state.mean(p.start_s, p.duration_s, u)
        state.passed(p.start_s, p.duration_s, u)
    return [out[id(p)] for p in passes]


def factors(passes, heat: Heat) -> list[float]:
    """The factor of every pass of a logged run (as `levels`)."""
    if heat.zero:
        return [1.0] * len(passes)
    return [1.0 + heat.kappa_of(p.new_tokens, p.context_lens) * h for p, h in zip(passes, levels(passes, heat))]


def logged_times(cost, passes) -> list[float]:
    """Every logged pass priced as the simulator runs it: `cost`'s pass time, times the factor
    of the heat the cost model carries (if any)."""
    heat = getattr(cost, "heat", None) or Heat()
    return [cost.pass_time(p.new_tokens, p.context_lens) * f for p, f in zip(passes, factors(passes, heat))]
