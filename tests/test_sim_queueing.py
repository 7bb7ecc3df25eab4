"""The simulator against queueing theory.

Each model is checked two ways: against the formula (within a tolerance of about 3.5 sampling
standard deviations of the estimate at this run length, measured over 40 seeds with a direct
numpy simulation), and, where a recursion gives the exact sample path, against that recursion
on the very same arrivals and service times (to float rounding). Seeds are fixed.
"""
import heapq
import math

import numpy as np
import pytest

from core.config import get_preset
from core.roofline import get_gpu
from sim.cost import ConstantCost, RooflineCost
from core.kv import BlockPool
from core.metrics import littles_law
from core.scheduler import ChunkedPrefill, ContinuousBatching
from sim.run import simulate
from traces.trace import Trace


def lindley_waits(arrival: np.ndarray, service: np.ndarray) -> np.ndarray:
    """Exact FCFS single-server waits: W[i] = max(0, W[i-1] + S[i-1] - (A[i] - A[i-1]))."""
    w = np.zeros(len(arrival))
    for i in range(1, len(arrival)):
        w[i] = max(0.0, w[i - 1] + service[i - 1] - (arrival[i] - arrival[i - 1]))
    return w


def erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits in M/M/c with offered load a = lambda / mu."""
    top = a ** c / math.factorial(c) * c / (c - a)
    return top / (sum(a ** k / math.factorial(k) for k in range(c)) + top)


def test_md1_mean_wait_is_pollaczek_khinchine():
    """Batch size 1, one output token per request, every pass 1 s: each request is one pass,
    so the replica is an M/D/1 server. PK: Wq = rho * D / (2 (1 - rho)). At 100,000 requests
    the estimate's sampling std is 0.9%; the issue asks for 2%."""
    n, rho, d = 100_000, 0.3, 1.0
    rng = np.random.default_rng(0)
    arrival = np.cumsum(rng.exponential(d / rho, n))
    trace = Trace(arrival, np.ones(n, int), np.ones(n, int))
    res = simulate(trace, lambda: ContinuousBatching(BlockPool(64, 16), max_num_seqs=1, max_model_len=64),
                   ConstantCost(d))
    waits = np.array([r.first_token_s - r.arrival_s - d for r in res.requests])
    assert np.allclose(waits, lindley_waits(arrival, np.full(n, d)), atol=1e-6)
    pk = rho * d / (2 * (1 - rho))
    assert waits.mean() == pytest.approx(pk, rel=0.02)


def geometric_service_trace(rng, n: int, lam: float, mean_passes: int):
    """Poisson arrivals; outputs geometric with mean `mean_passes`, so a request needing one pass
    per token holds its server for an exponential-looking time (mean_passes x the pass time)."""
    arrival = np.cumsum(rng.exponential(1 / lam, n))
    outputs = rng.geometric(1 / mean_passes, n)
    return Trace(arrival, np.ones(n, int), outputs), arrival, outputs


def test_mm1_matches_the_exponential_server():
    """One sequence at a time, 1 ms passes, geometric outputs of mean 1,000 tokens: service is
    geometric x 1 ms, exponential to within 0.1%, mean 1 s. Millions of passes, run as a few
    tens of thousands of fast-forwarded steps. Sampling std at n=30,000, rho=0.5: mean wait
    2.7%, mean time in system 1.5%, P(wait) 1.1%."""
    n, lam, delta = 30_000, 0.5, 1e-3
    trace, arrival, outputs = geometric_service_trace(np.random.default_rng(1), n, lam, 1000)
    res = simulate(trace, lambda: ChunkedPrefill(BlockPool(10**6, 16), max_num_seqs=1, max_num_batched_tokens=16,
                                                 max_model_len=10**7), ConstantCost(delta))
    assert res.num_passes == outputs.sum() and res.num_steps < 3 * n
    start = np.array([r.first_token_s - delta for r in res.requests])
    sojourn = np.array([r.finish_s - r.arrival_s for r in res.requests])
    waits = start - arrival
    assert np.allclose(waits, lindley_waits(arrival, outputs * delta), atol=1e-6)
    rho = lam  # mu = 1
    assert waits.mean() == pytest.approx(rho / (1 - rho), rel=0.10)
    assert sojourn.mean() == pytest.approx(1 / (1 - rho), rel=0.05)
    assert (waits > 0).mean() == pytest.approx(rho, rel=0.04)


def test_mmc_matches_erlang_c():
    """c servers sharing one queue: up to c sequences decode at once and a pass takes 1 ms
    whatever the batch, so each sequence advances a token per pass independently of the
    others, as a server of its own; chunked prefill lets a newcomer join the very next pass
    (at most 1 ms late, a 0.1% effect). Sampling std at n=30,000, c=3, rho=0.6: mean wait
    4.4%, mean time in system 1.3%, P(wait) 2.2%."""
    n, c, rho, delta = 30_000, 3, 0.6, 1e-3
    lam = c * rho
    trace, arrival, _ = geometric_service_trace(np.random.default_rng(2), n, lam, 1000)
    res = simulate(trace, lambda: ChunkedPrefill(BlockPool(10**6, 16), max_num_seqs=c, max_num_batched_tokens=16,
                                                 max_model_len=10**7), ConstantCost(delta))
    waits = np.array([r.first_token_s - delta - r.arrival_s for r in res.requests])
    sojourn = np.array([r.finish_s - r.arrival_s for r in res.requests])
    p_wait = erlang_c(c, lam)
    wq = p_wait / (c - lam)
    assert waits.mean() == pytest.approx(wq, rel=0.15)
    assert sojourn.mean() == pytest.approx(wq + 1, rel=0.05)
    assert (waits > 2 * delta).mean() == pytest.approx(p_wait, rel=0.08)


def test_littles_law_on_a_busy_cluster_with_preemptions():
    rng = np.random.default_rng(3)
    n = 3000
    trace = Trace(np.cumsum(rng.exponential(0.01, n)), rng.integers(10, 2000, n), rng.integers(1, 500, n))
    cost = RooflineCost(get_preset("qwen2.5-1.5b"), get_gpu("h200"))
    res = simulate(trace, lambda: ContinuousBatching(BlockPool(400, 16), max_model_len=6400), cost, replicas=2)
    assert sum(r.preemptions for r in res.requests) > 0
    L, lam, W = littles_law(res.requests)
    assert L == pytest.approx(lam * W, rel=1e-9)
    # the time-average in system, measured independently on a grid, agrees too
    grid = np.linspace(res.requests[0].arrival_s, max(r.finish_s for r in res.requests), 200_001)
    a = np.array([r.arrival_s for r in res.requests])
    f = np.array([r.finish_s for r in res.requests])
    in_system = np.searchsorted(np.sort(a), grid, side="right") - np.searchsorted(np.sort(f), grid, side="right")
    assert in_system.mean() == pytest.approx(L, rel=0.01)
