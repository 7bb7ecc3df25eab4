"""Shared by the simulator's tests: tiny traces and a run that checks itself."""
from __future__ import annotations

import math

import numpy as np

from core.metrics import littles_law
from sim.run import SimResult, simulate
from traces.trace import Trace


def trace_of(rows, **kw) -> Trace:
    """A Trace from (arrival_s, prompt_tokens, output_tokens) rows."""
    a, p, o = zip(*rows)
    return Trace(np.array(a, float), np.array(p), np.array(o), **kw)


def checked_run(trace: Trace, make_scheduler, cost, **kw) -> SimResult:
    """simulate() with token times and pass records kept, after checking that every request
    ended, token times are sane and Little's law holds."""
    kw.setdefault("keep_token_times", True)
    kw.setdefault("log_passes", True)
    result = simulate(trace, make_scheduler, cost, **kw)
    assert len(result.requests) == len(trace)
    for r in result.requests:
        assert r.completed or r.rejected, r
        if r.completed:
            times = r.token_times_s
            assert len(times) == r.output_tokens == r.max_output_tokens
            assert times[0] > r.arrival_s
            assert r.arrival_s <= r.queued_s <= r.scheduled_s < times[0], r
            assert all(b >= a for a, b in zip(times, times[1:]))
    L, lam, W = littles_law(result.requests)
    assert math.isclose(L, lam * W, rel_tol=1e-9, abs_tol=1e-12), (L, lam, W)
    return result


def token_times(result: SimResult) -> dict[str, list[float]]:
    return {r.request_id: r.token_times_s for r in result.requests}
