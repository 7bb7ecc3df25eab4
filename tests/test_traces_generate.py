"""Generators: arrival statistics match their definitions, and a seed fixes the trace."""
from __future__ import annotations

import math

import numpy as np
import pytest

from traces.generate import (SEED_PROMPTS, choice, daily_curve, fixed_prompts, gamma, on_off, poisson,
                             ramp, uniform)


def gap_stats(trace) -> tuple[float, float]:
    gaps = np.diff(trace.arrival_s)
    return gaps.mean(), gaps.std() / gaps.mean()


def test_poisson_mean_gap_is_one_over_rate_and_cv_is_one():
    mean, cv = gap_stats(poisson(5.0, n=20_000, seed=1))
    assert mean == pytest.approx(1 / 5.0, rel=0.03)
    assert cv == pytest.approx(1.0, abs=0.03)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_cv_is_one_over_sqrt_burstiness_at_the_asked_rate(burstiness):
    mean, cv = gap_stats(gamma(2.0, burstiness, n=20_000, seed=2))
    assert mean == pytest.approx(0.5, rel=0.05)
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.06)


def test_poisson_over_a_duration_starts_at_zero_and_stops_before_the_end():
    trace = poisson(10.0, duration_s=300.0, seed=3)
    assert trace.arrival_s[0] == 0.0 and trace.arrival_s[-1] < 300.0
    assert len(trace) == pytest.approx(3000, rel=0.1)
    longer = poisson(10.0, n=len(trace) + 10, seed=3)  # same seed, same stream: a prefix
    assert np.array_equal(longer.arrival_s[:len(trace)], trace.arrival_s)


def test_same_seed_same_trace_other_seed_other_trace():
    a = gamma(3.0, 0.5, n=200, prompt_tokens=uniform(10, 500), output_tokens=choice([8, 64]), seed=7)
    b = gamma(3.0, 0.5, n=200, prompt_tokens=uniform(10, 500), output_tokens=choice([8, 64]), seed=7)
    c = gamma(3.0, 0.5, n=200, prompt_tokens=uniform(10, 500), output_tokens=choice([8, 64]), seed=8)
    for col in ("arrival_s", "prompt_tokens", "output_tokens"):
        assert np.array_equal(getattr(a, col), getattr(b, col))
        assert not np.array_equal(getattr(a, col), getattr(c, col))


def test_changing_lengths_does_not_move_arrivals():
    a = poisson(4.0, n=100, prompt_tokens=256, seed=5)
    b = poisson(4.0, n=100, prompt_tokens=uniform(1, 4096), seed=5)
    assert np.array_equal(a.arrival_s, b.arrival_s)


def test_samplers_stay_in_their_range():
    trace = poisson(1.0, n=2000, prompt_tokens=uniform(10, 20), output_tokens=choice([1, 3]), seed=0)
    assert trace.prompt_tokens.min() == 10 and trace.prompt_tokens.max() == 20
    assert set(trace.output_tokens.tolist()) == {1, 3}


def test_fixed_prompts_is_the_seed_workload():
    trace = fixed_prompts(n=500, seed=0)
    assert set(trace.prompt_tokens.tolist()) == set(SEED_PROMPTS)
    assert set(trace.output_tokens.tolist()) == {256}
    assert trace.arrival_s.max() == 0.0  # infinite rate: an offline batch
    assert fixed_prompts(n=3000, rate=2.0, seed=0).rate == pytest.approx(2.0, rel=0.05)


def test_on_off_sends_at_rate_on_during_bursts_and_rate_off_between():
    trace = on_off(rate_on=20.0, on_s=10.0, off_s=30.0, rate_off=1.0, duration_s=4000.0, seed=4)
    phase = trace.arrival_s % 40.0
    on, off = (phase < 10.0).sum(), (phase >= 10.0).sum()
    assert on / (100 * 10.0) == pytest.approx(20.0, rel=0.05)  # 100 cycles
    assert off / (100 * 30.0) == pytest.approx(1.0, rel=0.1)
    assert len(on_off(5.0, 1.0, 1.0, n=777, seed=4)) == 777


def test_ramp_rate_follows_its_curve():
    trace = ramp([1.0, 20.0], duration_s=2000.0, seed=6)
    edges = np.linspace(0.0, 2000.0, 11)
    counts = np.histogram(trace.arrival_s, edges)[0]
    expected = [(1.0 + 19.0 * (a + b) / 2 / 2000.0) * (b - a) for a, b in zip(edges, edges[1:])]
    assert np.all(np.abs(counts - expected) < 4.5 * np.sqrt(expected))
    assert trace.arrival_s.max() < 2000.0


def test_daily_curve_peaks_at_its_hour_and_bottoms_twelve_hours_later():
    rates = daily_curve(peak_rate=10.0, trough_rate=2.0, peak_hour=14.0, points=97)  # every 15 min
    assert rates[14 * 4] == pytest.approx(10.0) and rates[2 * 4] == pytest.approx(2.0)
    trace = ramp(rates, duration_s=3600.0, seed=0)  # a day in an hour
    afternoon = ((trace.arrival_s > 3600 * 12 / 24) & (trace.arrival_s < 3600 * 16 / 24)).sum()
    night = ((trace.arrival_s > 0) & (trace.arrival_s < 3600 * 4 / 24)).sum()
    assert afternoon > 3 * night


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="exactly one"):
        poisson(1.0)
    with pytest.raises(ValueError, match="exactly one"):
        poisson(1.0, n=5, duration_s=5.0)
    with pytest.raises(ValueError, match="rate must be positive"):
        poisson(0.0, n=5)
    with pytest.raises(ValueError, match="give n"):
        poisson(math.inf, duration_s=5.0)
    with pytest.raises(ValueError, match="at least 1"):
        poisson(1.0, n=5, prompt_tokens=0)
    # bounds instead of allocations that cannot succeed
    with pytest.raises(ValueError, match="n must be from 1 to 100,000,000"):
        poisson(1.0, n=10**12)
    with pytest.raises(ValueError, match="at most 1e\\+08 s"):
        poisson(1.0, duration_s=1e15)
    with pytest.raises(ValueError, match="more than the 100,000,000 a generated trace may hold"):
        poisson(1e300, duration_s=1.0)
    with pytest.raises(ValueError, match="past the 1e\\+08 s a trace may span"):
        poisson(1e-6, n=1000)
    with pytest.raises(ValueError, match="more than the 100,000,000"):
        on_off(math.inf, 1.0, 1.0, n=5)
