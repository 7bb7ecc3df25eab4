"""The engine's own scatter, for simulations that draw it (`--noise`, `python -m sim compare --seeds`).

A real engine never runs the same pass in the same time twice: on the H200 a rested decode pass
of one shape scatters by about 0.3% (robust standard deviation of its log), and the host's time
to build and launch a CUDA graph by a factor of about 1.5 (0.26-0.61 ms, p10-p90, around a
median of 0.38 ms). The calibration's terms are medians; a simulation without scatter is one
schedule, and near ties (a request arriving a few microseconds before or after the moment a plan
reads the arrivals) send real runs of one workload down different ones. With noise, each pass's
time and each host term is its calibrated value times exp(sigma * z), z standard normal from a
seeded generator: the median stays the calibration's, and seeds give a spread of schedules.

The sigmas are the calibration file's optional "noise" field (`calibrate fit` measures them:
the pass's from the heat run's rested probes, or the sweep's repeats of a shape; the host's from
the open runs' pass logs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.host import optional_section, real

MAX_SIGMA = 2.0


@dataclass(frozen=True)
class Noise:
    pass_sigma: float = 0.0          # a pass's time
    idle_sigma: float = 0.0          # the host's start of a pass planned on an idle engine
    launch_sigma: float = 0.0        # building and launching a graph (and reading a pass's tokens back)
    eager_launch_sigma: float = 0.0  # launching a pass kernel by kernel

    def __post_init__(self) -> None:
        for name in ("pass_sigma", "idle_sigma", "launch_sigma", "eager_launch_sigma"):
            v = getattr(self, name)
            if not real(v) or not 0 <= v <= MAX_SIGMA:
                raise ValueError(f"noise.{name} must be a number from 0 to {MAX_SIGMA:g}, got {v!r}")

    @classmethod
    def from_dict(cls, d, source: str = "calibration") -> "Noise":
        """The calibration file's "noise" field (None: no scatter)."""
        return optional_section(cls, d, "noise", source)

    @property
    def zero(self) -> bool:
        return not (self.pass_sigma or self.idle_sigma or self.launch_sigma or self.eager_launch_sigma)

    def as_dict(self) -> dict:
        return {"pass_sigma": self.pass_sigma, "idle_sigma": self.idle_sigma, "launch_sigma": self.launch_sigma,
                "eager_launch_sigma": self.eager_launch_sigma}


def measured_noise(cost) -> Noise | None:
    """The scatter a cost model measured (a calibration's "noise"), None where it measured none."""
    noise = getattr(cost, "noise", None)
    return None if noise is None or noise.zero else noise


def robust_sigma(samples) -> float:
    """The scatter of positive samples around their median: 1.4826 x the median absolute deviation
    of their logs (the standard deviation of a log-normal's log, not swayed by outliers)."""
    logs = np.log(np.asarray([s for s in samples if s > 0], float))
    if logs.size < 2:
        return 0.0
    return float(1.4826 * np.median(np.abs(logs - np.median(logs))))


class NoisyHost:
    """A `sim.host.HostTime` whose terms scatter (same interface)."""

    def __init__(self, host, noise: Noise, draw):
        self.host, self.noise, self.draw = host, noise, draw
        self.zero = host.zero

    @property
    def retire_s(self) -> float:
        return self.host.retire_s * self.draw(self.noise.launch_sigma)

    def idle_delay(self, plan, woke: bool) -> float:
        return self.host.idle_delay(plan, woke) * self.draw(self.noise.idle_sigma)

    def launch_time(self, plan) -> float:
        eager = self.host.graph_tokens and sum(plan.new_tokens) > self.host.graph_tokens
        return self.host.launch_time(plan) * self.draw(self.noise.eager_launch_sigma if eager else self.noise.launch_sigma)


class NoisyCost:
    """A cost model whose pass times (and whose host's terms) scatter as `noise` says, drawn from a
    generator seeded with `seed`; everything else is the wrapped model's."""

    def __init__(self, cost, noise: Noise, seed: int):
        self.cost, self.noise = cost, noise
        rng = np.random.default_rng(seed)
        self.draw = lambda sigma: math.exp(sigma * rng.standard_normal()) if sigma else 1.0
        host = getattr(cost, "host", None)
        self.host = NoisyHost(host, noise, self.draw) if host is not None and not host.zero else host

    def __getattr__(self, name):
        return getattr(self.cost, name)

    def pass_time(self, new_tokens, context_lens) -> float:
        return self.cost.pass_time(new_tokens, context_lens) * self.draw(self.noise.pass_sigma)

    def decode_line(self, *args):
        """A fast-forwarded run of decode passes scatters as one: its line times one draw."""
        line = self.cost.decode_line(*args)
        if line is None:
            return None
        a, b, valid = line
        f = self.draw(self.noise.pass_sigma)
        return a * f, b * f, valid
