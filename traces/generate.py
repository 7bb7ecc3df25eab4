"""Seeded synthetic workloads: Poisson and gamma arrivals (vLLM's definitions), the part0
workload of fixed prompts, on/off bursts, and a rate that ramps over time (e.g. over a day).

Conventions:
- Renewal processes (`poisson`, `gamma`, `fixed_prompts`) put the first request at t = 0, as
  vLLM's benchmark does, so a trace of n requests has n - 1 gaps and `Trace.rate` estimates the
  rate asked for. Time-varying ones (`on_off`, `ramp`) keep the clock of their rate curve.
- Ask for a number of requests (`n`) or a length of time (`duration_s`), not both.
- Token lengths are an int (every request the same) or a sampler: a function
  `(rng, n) -> n lengths`, e.g. `choice([16, 256, 4096])` or `uniform(64, 512)`.
- One seed drives three independent streams (arrivals, prompt lengths, output lengths), so
  changing the lengths does not move the arrival times, and vice versa.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from traces.trace import MAX_ARRIVAL_S, Trace

# The most requests a generated trace may hold: 100 million (about 2.4 GB of columns); past it,
# and past MAX_ARRIVAL_S seconds, a generator refuses instead of trying to allocate.
MAX_REQUESTS = 100_000_000

Sampler = Callable[[np.random.Generator, int], np.ndarray]
Lengths = int | Sampler

SEED_PROMPTS = (16, 64, 256, 1024, 4096)  # the part0 workload's prompts, p16 ... p4096


def choice(values: Sequence[int], weights: Sequence[float] | None = None) -> Sampler:
    """Lengths drawn from `values` (uniformly, or with `weights`)."""
    values = np.asarray(values, dtype=np.int64)
    p = None if weights is None else np.asarray(weights, dtype=float) / np.sum(weights)
    return lambda rng, n: rng.choice(values, size=n, p=p)


def uniform(low: int, high: int) -> Sampler:
    """Lengths drawn uniformly from low..high, both included."""
    return lambda rng, n: rng.integers(low, high, size=n, endpoint=True)


def poisson(rate: float, n: int | None = None, duration_s: float | None = None,
            prompt_tokens: Lengths = 256, output_tokens: Lengths = 256, seed: int = 0) -> Trace:
    """Poisson arrivals: exponential gaps with mean 1/rate. `rate=inf` sends all n at t = 0."""
    return gamma(rate, 1.0, n, duration_s, prompt_tokens, output_tokens, seed,
                 name=f"poisson(rate={rate:g},seed={seed})")


def gamma(rate: float, burstiness: float, n: int | None = None, duration_s: float | None = None,
          prompt_tokens: Lengths = 256, output_tokens: Lengths = 256, seed: int = 0,
          name: str | None = None) -> Trace:
    """Gamma-distributed gaps as in vLLM's benchmark: shape = burstiness, mean gap = 1/rate, so
    the gaps' coefficient of variation is 1/sqrt(burstiness): < 1 burstier, 1 Poisson, > 1 smoother."""
    if not burstiness > 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    streams = _streams(seed)
    arrival_s = _renewal_arrivals(streams[0], rate, burstiness, n, duration_s)
    return _trace(arrival_s, prompt_tokens, output_tokens, streams,
                  name or f"gamma(rate={rate:g},burstiness={burstiness:g},seed={seed})")


def fixed_prompts(n: int | None = 100, rate: float = math.inf, prompts: Sequence[int] = SEED_PROMPTS,
                  output_tokens: Lengths = 256, duration_s: float | None = None, seed: int = 0) -> Trace:
    """The part0 workload: prompt lengths drawn from p16 ... p4096, 256 output tokens, Poisson
    arrivals at `rate` (the default, inf, sends every request at t = 0 like an offline batch)."""
    if duration_s is not None:
        n = None
    return poisson(rate, n, duration_s, choice(prompts), output_tokens, seed)


def on_off(rate_on: float, on_s: float, off_s: float, rate_off: float = 0.0, n: int | None = None,
           duration_s: float | None = None, prompt_tokens: Lengths = 256,
           output_tokens: Lengths = 256, seed: int = 0) -> Trace:
    """Bursts: Poisson at `rate_on` for `on_s` seconds, then at `rate_off` for `off_s`, repeated
    from an "on" period at t = 0."""
    if not (rate_on > 0 and rate_off >= 0 and on_s > 0 and off_s >= 0):
        raise ValueError("on_off needs rate_on > 0, rate_off >= 0, on_s > 0 and off_s >= 0")
    cycle = on_s + off_s

    def rate_at(t: np.ndarray) -> np.ndarray:
        return np.where(t % cycle < on_s, rate_on, rate_off)

    mean_rate = (rate_on * on_s + rate_off * off_s) / cycle
    streams = _streams(seed)
    arrival_s = _nonhomogeneous_arrivals(streams[0], rate_at, max(rate_on, rate_off), mean_rate,
                                         n, duration_s)
    return _trace(arrival_s, prompt_tokens, output_tokens, streams,
                  f"on_off(on={rate_on:g}x{on_s:g}s,off={rate_off:g}x{off_s:g}s,seed={seed})")


def ramp(rates: Sequence[float], duration_s: float, prompt_tokens: Lengths = 256,
         output_tokens: Lengths = 256, seed: int = 0) -> Trace:
    """A rate that changes over time: `rates` are spread evenly from t = 0 to `duration_s` and
    joined by straight lines (two values make a linear ramp; `daily_curve()` makes a day, which
    `duration_s` may compress, e.g. a day in an hour). Drawn by thinning a Poisson process."""
    rates = np.asarray(rates, dtype=float)
    if rates.size < 2 or rates.min() < 0 or not rates.max() > 0:
        raise ValueError("ramp needs at least two non-negative rates, not all zero")
    knots = np.linspace(0.0, duration_s, rates.size)
    streams = _streams(seed)
    arrival_s = _nonhomogeneous_arrivals(streams[0], lambda t: np.interp(t, knots, rates),
                                         rates.max(), rates.mean(), None, duration_s)
    return _trace(arrival_s, prompt_tokens, output_tokens, streams,
                  f"ramp({rates.size} points over {duration_s:g}s,seed={seed})")


def daily_curve(peak_rate: float, trough_rate: float, peak_hour: float = 14.0,
                points: int = 97) -> list[float]:
    """Rates over 24 hours for `ramp`: a cosine from `trough_rate` (12 h from the peak) up to
    `peak_rate` at `peak_hour`, sampled at `points` evenly spaced times from 0 h to 24 h."""
    hours = np.linspace(0.0, 24.0, points)
    shape = (1 + np.cos(2 * np.pi * (hours - peak_hour) / 24.0)) / 2
    return (trough_rate + (peak_rate - trough_rate) * shape).tolist()


def _streams(seed: int) -> list[np.random.Generator]:
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)]


def _check_size(n: int | None, duration_s: float | None) -> None:
    if (n is None) == (duration_s is None):
        raise ValueError("give exactly one of n (number of requests) and duration_s")
    if n is not None and not 1 <= n <= MAX_REQUESTS:
        raise ValueError(f"n must be from 1 to {MAX_REQUESTS:,}, got {n}")
    if duration_s is not None and not 0 < duration_s <= MAX_ARRIVAL_S:
        raise ValueError(f"duration_s must be positive and at most {MAX_ARRIVAL_S:g} s, got {duration_s}")


def _check_expected(rate: float, duration_s: float) -> None:
    """Refuse a rate and duration that would draw more than MAX_REQUESTS arrivals."""
    if not rate * duration_s <= MAX_REQUESTS:  # NaN too (an infinite rate over no time)
        raise ValueError(f"rate {rate:g}/s for {duration_s:g} s makes about {rate * duration_s:.3g} requests, "
                         f"more than the {MAX_REQUESTS:,} a generated trace may hold")


def _renewal_arrivals(rng: np.random.Generator, rate: float, shape: float, n: int | None,
                      duration_s: float | None) -> np.ndarray:
    _check_size(n, duration_s)
    if not rate > 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if math.isinf(rate):
        if n is None:
            raise ValueError("an infinite rate sends everything at t = 0: give n, not duration_s")
        return np.zeros(n)
    scale = 1.0 / (rate * shape)
    if duration_s is not None:
        _check_expected(rate, duration_s)
    if n is not None:
        return np.concatenate([[0.0], np.cumsum(rng.gamma(shape, scale, n - 1))])
    # Draw gaps in blocks until past the end; the stream is the same as one long draw, so a
    # duration-bounded trace is a prefix of the n-bounded one with the same seed.
    parts, last = [np.zeros(1)], 0.0
    block = int(rate * duration_s) + 16
    while last < duration_s:
        times = last + np.cumsum(rng.gamma(shape, scale, block))
        parts.append(times)
        last = times[-1]
    arrival_s = np.concatenate(parts)
    return arrival_s[arrival_s < duration_s]


def _nonhomogeneous_arrivals(rng: np.random.Generator, rate_at: Callable[[np.ndarray], np.ndarray],
                             max_rate: float, mean_rate: float, n: int | None,
                             duration_s: float | None) -> np.ndarray:
    """Thinning (Lewis and Shedler): candidates from a Poisson process at `max_rate`, each kept
    with probability rate_at(t) / max_rate. For `n`, the horizon doubles until n are drawn."""
    _check_size(n, duration_s)
    state = rng.bit_generator.state
    horizon = duration_s if n is None else 1.5 * n / mean_rate
    while True:
        _check_expected(max_rate, horizon)
        rng.bit_generator.state = state  # each attempt replays the same stream
        count = rng.poisson(max_rate * horizon)
        times = np.sort(rng.uniform(0.0, horizon, count))
        kept = times[rng.uniform(0.0, max_rate, count) < rate_at(times)]
        if n is None:
            return kept
        if kept.size >= n:
            return kept[:n]
        horizon *= 2


def _trace(arrival_s: np.ndarray, prompt_tokens: Lengths, output_tokens: Lengths,
           streams: list[np.random.Generator], name: str) -> Trace:
    n = len(arrival_s)
    if n and arrival_s[-1] > MAX_ARRIVAL_S:
        raise ValueError(f"{name}: arrivals reach {arrival_s[-1]:.3g} s, past the {MAX_ARRIVAL_S:g} s a trace may "
                         "span; ask for fewer requests or a higher rate")
    return Trace(arrival_s=arrival_s,
                 prompt_tokens=_lengths(prompt_tokens, streams[1], n, "prompt_tokens"),
                 output_tokens=_lengths(output_tokens, streams[2], n, "output_tokens"),
                 name=name)


def _lengths(spec: Lengths, rng: np.random.Generator, n: int, what: str) -> np.ndarray:
    if isinstance(spec, (int, np.integer)):
        values = np.full(n, int(spec), dtype=np.int64)
    else:
        values = np.asarray(spec(rng, n), dtype=np.int64)
    if values.shape != (n,):
        raise ValueError(f"{what} sampler returned shape {values.shape}, expected ({n},)")
    if n and values.min() < 1:
        raise ValueError(f"{what} must be at least 1, got {values.min()}")
    return values
