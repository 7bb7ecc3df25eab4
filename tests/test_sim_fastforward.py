"""Fast-forwarding runs of decode passes gives the same records as stepping every pass."""
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.config import get_preset
from core.roofline import get_gpu
from core.routers import LeastKVLoad, LeastOutstanding, PowerOfTwo, RoundRobin
from sim.cost import CalibratedCost, ConstantCost, RooflineCost
from test_sim_cost import calibration
from core.kv import BlockPool, PrefixBlockPool, blocks_for
from core.scheduler import ChunkedPrefill, ContinuousBatching, DecodePriority, StaticBatching, by_priority
from sim.replica import SwapLink
from sim.run import Disaggregation
from sim_helpers import checked_run
from traces.trace import Trace

MODEL = get_preset("qwen2.5-1.5b")
ROOFLINE = RooflineCost(MODEL, get_gpu("h200"))
# a calibrated model whose padded graph buckets, regime changes and decode-attention slicing
# (short slices, so the critical path changes often) cut decode runs into many lines
CALIBRATED_FILE = calibration(
    graph_buckets=[1, 2, 4, 8, 16, 24, 32, 64],
    decode_attention={"kv_heads": 2, "fills_gpu": 16, "block_n": 16, "small": [8, 32], "big": [4, 128]})
CALIBRATED = CalibratedCost(CALIBRATED_FILE)


def random_trace(seed: int, n: int = 120, rate: float = 40.0, hashes: bool = False) -> Trace:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(1, 400, n)
    block_hashes = None
    if hashes:  # three shared system prompts of 1-3 blocks of 64 tokens, then unique blocks
        block_hashes = []
        for i, p in enumerate(prompt):
            shared = [int(rng.integers(3)) * 10 + j for j in range(int(rng.integers(1, 4)))]
            block_hashes.append((shared + [1000 * (i + 1) + j for j in range(8)])[:max(1, blocks_for(int(p), 64))])
    return Trace(np.cumsum(rng.exponential(1 / rate, n)), prompt, rng.integers(1, 120, n),
                 priority=rng.integers(0, 3, n), block_hashes=block_hashes)


def assert_same_runs(trace, make_scheduler, cost, make_router=None, fewer_steps=True, **kw):
    ff = checked_run(trace, make_scheduler, cost, fast_forward=True, router=make_router and make_router(), **kw)
    step = checked_run(trace, make_scheduler, cost, fast_forward=False, router=make_router and make_router(), **kw)
    assert ff.num_passes == step.num_passes == len(step.passes)
    for a, b in zip(ff.requests, step.requests):
        assert (a.request_id, a.output_tokens, a.preemptions, a.rejected, a.replica) == \
               (b.request_id, b.output_tokens, b.preemptions, b.rejected, b.replica)
        assert np.allclose(a.token_times_s, b.token_times_s, rtol=1e-9, atol=0)
        if a.completed:
            assert math.isclose(a.itl_sum_s, b.itl_sum_s, rel_tol=1e-9, abs_tol=1e-12)
    for p, q in zip(ff.passes, step.passes):
        assert (p.replica, p.kind, p.new_tokens, p.context_lens) == (q.replica, q.kind, q.new_tokens, q.context_lens)
        assert math.isclose(p.start_s, q.start_s, rel_tol=1e-9)
        assert math.isclose(p.duration_s, q.duration_s, rel_tol=1e-9)
    assert ff.peak_kv_blocks == step.peak_kv_blocks
    assert step.num_steps == step.num_passes and (ff.num_steps < step.num_steps or not fewer_steps)
    return ff, step


def small_kv():
    return BlockPool(150, block_size=4)  # 600 tokens: busy traces preempt


POLICIES = {
    "continuous": lambda: ContinuousBatching(small_kv(), max_model_len=600),
    "continuous-swap": lambda: ContinuousBatching(small_kv(), max_model_len=600, preemption="swap"),
    "chunked": lambda: ChunkedPrefill(small_kv(), max_num_seqs=16, max_num_batched_tokens=128, max_model_len=600),
    "static": lambda: StaticBatching(small_kv(), batch_size=6, timeout_s=0.05, max_model_len=600),
    "decode-priority": lambda: DecodePriority(small_kv(), max_waiting_passes=7, max_model_len=600),
    "priority": lambda: ContinuousBatching(small_kv(), max_num_seqs=8, max_model_len=600, order=by_priority),
}


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("cost", [ROOFLINE, CALIBRATED, ConstantCost(1e-3)], ids=["roofline", "calibrated", "constant"])
def test_fast_forward_matches_stepping(policy, cost):
    swap = SwapLink(MODEL.kv_bytes_per_token(), 25e9) if policy.endswith("swap") else None
    ff, _ = assert_same_runs(random_trace(1), POLICIES[policy], cost, swap_link=swap)
    if policy != "static":
        assert sum(r.preemptions for r in ff.requests) > 0 or policy == "priority"


def test_fast_forward_matches_stepping_where_a_schedule_prices_full_batches():
    """Batches that fill the GPU priced by their programs' schedule have no line: they are stepped,
    the smaller ones' lines still run, and the records are the same either way."""
    d = json.loads(json.dumps(CALIBRATED_FILE))
    d["parameters"]["decode"]["schedule"] = {"kv_gbs": 4500.0, "block_s": 6e-5, "start_s": 4e-5}
    cost = CalibratedCost(d)
    kv = lambda: BlockPool(2000, block_size=16)  # noqa: E731
    ff, step = assert_same_runs(random_trace(3, n=200, rate=120), lambda: ContinuousBatching(kv(), max_model_len=600),
                                cost)
    decode = [len(p.new_tokens) for p in step.passes if p.kind == "decode"]
    assert any(cost.fills(n) for n in decode) and any(1 < n and not cost.fills(n) for n in decode)


def test_fast_forward_matches_stepping_with_prefix_caching():
    kv = lambda: PrefixBlockPool(200, block_size=16, hash_block_tokens=64)  # noqa: E731
    ff, _ = assert_same_runs(random_trace(2, hashes=True), lambda: ContinuousBatching(kv(), max_model_len=800),
                             ROOFLINE)
    assert sum(p.num_tokens for p in ff.passes if p.kind == "prefill") < sum(random_trace(2).prompt_tokens)


@pytest.mark.parametrize("router", [RoundRobin, LeastOutstanding, LeastKVLoad, PowerOfTwo])
def test_fast_forward_matches_stepping_behind_every_router(router):
    trace = random_trace(3, n=200, rate=120)
    ff, _ = assert_same_runs(trace, POLICIES["continuous"], ROOFLINE, lambda: router(7) if router is PowerOfTwo else router(), replicas=3)
    assert {r.replica for r in ff.requests} == {0, 1, 2}


def test_fast_forward_matches_stepping_when_disaggregated():
    d = Disaggregation(2, 2, lambda: ChunkedPrefill(small_kv(), max_num_seqs=16, max_model_len=600),
                       MODEL.kv_bytes_per_token(), link_bytes_per_s=10e9, link_latency_s=1e-4)
    assert_same_runs(random_trace(4, rate=80), POLICIES["continuous"], ROOFLINE, disaggregate=d)


def test_fast_forward_crosses_the_roofline_ridge_exactly():
    # Big batches of long contexts turn decode compute-bound part-way through a run.
    rng = np.random.default_rng(5)
    n = 300
    trace = Trace(np.zeros(n), rng.integers(1, 60, n), rng.integers(200, 800, n))
    line = ROOFLINE.decode_line(300, 300 * 30)
    assert line[2] < 800  # the regime changes within the run
    kv = lambda: BlockPool(30000, block_size=16)  # noqa: E731
    assert_same_runs(trace, lambda: ContinuousBatching(kv(), max_num_seqs=300, max_model_len=1000), ROOFLINE)


def test_a_prompt_whose_last_chunk_is_one_token_starts_its_output_in_a_fast_forwarded_run():
    # budget 32: a 33-token prompt ends with a 1-token chunk, which looks like a decode
    trace = Trace(np.array([0.0, 0.5]), np.array([33, 65]), np.array([5, 3]))
    make = lambda: ChunkedPrefill(small_kv(), max_num_seqs=1, max_num_batched_tokens=32, max_model_len=600)  # noqa: E731
    ff, _ = assert_same_runs(trace, make, ROOFLINE)
    assert all(r.first_token_s is not None for r in ff.requests)
    kv = lambda: PrefixBlockPool(200, block_size=16, hash_block_tokens=32)  # noqa: E731
    hashed = Trace(np.array([0.0, 0.5]), np.array([33, 33]), np.array([5, 3]), block_hashes=[[1], [1]])
    prefix = lambda: ChunkedPrefill(kv(), max_num_seqs=1, max_num_batched_tokens=32, max_model_len=800)  # noqa: E731
    ff, _ = assert_same_runs(hashed, prefix, ROOFLINE)
    # the second prompt found its first 32 tokens cached: 33+4 and 1+2 tokens computed, not 33+4 and 33+2
    assert sum(p.num_tokens for p in ff.passes) == 40
    d = Disaggregation(1, 1, make, MODEL.kv_bytes_per_token(), link_bytes_per_s=10e9)
    assert_same_runs(trace, make, ROOFLINE, disaggregate=d)


def test_passes_started_counts_the_pass_in_flight():
    from sim.replica import passes_started, run_time
    rng = np.random.default_rng(6)
    for _ in range(500):
        a, k = rng.uniform(1e-4, 1e-2), int(rng.integers(1, 5000))
        b = rng.choice([0.0, rng.uniform(-a / (2 * k), 1e-5)])  # passes stay positive, as cost models keep them
        elapsed = rng.uniform(0, run_time(a, b, k))
        ends = np.cumsum([a + b * j for j in range(k)])
        expected = max(1, min(k, int(np.searchsorted(ends, elapsed, side="left")) + 1))
        assert abs(passes_started(a, b, elapsed, k) - expected) <= (1 if np.isclose(ends, elapsed).any() else 0)
    assert passes_started(1.0, 0.0, 0.0, 10) == 1  # news at the very start waits for the first pass
    assert passes_started(1.0, 0.0, 3.0, 10) == 3  # exactly at a boundary: no pass in flight
    assert passes_started(1.0, 0.0, 3.5, 10) == 4


def test_an_arrival_on_a_pass_boundary_joins_it_whether_stepped_or_fast_forwarded():
    """Found by a user: the second request arrives exactly when the first one's 50th decode pass
    ends; stepping (durations added one by one) and fast-forward (boundaries in closed form)
    round that boundary to either side of 2.8, and used to disagree by a whole pass."""
    trace = Trace(np.array([2.7, 2.8]), np.array([47, 125]), np.array([94, 1]))
    make = lambda: ChunkedPrefill(small_kv(), max_model_len=600)  # noqa: E731
    ff, step = assert_same_runs(trace, make, ConstantCost(0.002))
    assert ff.requests[1].first_token_s == pytest.approx(2.802)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_fast_forward_matches_stepping_with_overlap(policy):
    swap = SwapLink(MODEL.kv_bytes_per_token(), 25e9) if policy.endswith("swap") else None
    assert_same_runs(random_trace(8), POLICIES[policy], ROOFLINE, swap_link=swap, overlap=True)


grid = st.fixed_dictionaries({
    "step": st.sampled_from([0.001, 0.002, 0.0025, 0.01]),
    "slots": st.lists(st.integers(0, 400), min_size=2, max_size=30),
    "prompts": st.lists(st.integers(1, 300), min_size=30, max_size=30),
    "outputs": st.lists(st.integers(1, 150), min_size=30, max_size=30),
    "policy": st.sampled_from(list(POLICIES)),
    "overlap": st.booleans(),
})


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grid)
def test_fast_forward_matches_stepping_when_arrivals_land_on_pass_boundaries(g):
    """Constant pass times and arrivals on the same grid: every arrival is a tie with some pass
    boundary (before float rounding), the case continuous random arrivals never produce."""
    slots = sorted(g["slots"])
    n = len(slots)
    trace = Trace(np.array(slots, float) * g["step"] + 2.7, np.array(g["prompts"][:n]), np.array(g["outputs"][:n]),
                  priority=np.arange(n) % 3)
    swap = SwapLink(MODEL.kv_bytes_per_token(), 25e9) if g["policy"].endswith("swap") else None
    assert_same_runs(trace, POLICIES[g["policy"]], ConstantCost(g["step"]), swap_link=swap, overlap=g["overlap"],
                     fewer_steps=False)


def test_news_as_a_fast_forwarded_run_begins_joins_its_second_pass_with_overlap():
    """Found by hypothesis: a request arriving at the very instant a decode run starts (a tie
    with the pass boundary) is seen by the plan of the run's second pass when stepping; the
    fast-forward used to run two passes before it (the second "planned already")."""
    trace = Trace(np.array([0, 0, 0, 71, 168, 199]) * 0.002 + 2.7, np.array([1, 1, 1, 1, 128, 1]),
                  np.array([1, 1, 1, 128, 32, 1]), priority=np.arange(6) % 3)
    ff, step = assert_same_runs(trace, POLICIES["chunked"], ConstantCost(0.002), overlap=True, fewer_steps=False)
    assert max(r.first_token_s for r in ff.requests) == pytest.approx(3.102)
