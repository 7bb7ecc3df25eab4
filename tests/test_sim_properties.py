"""Properties every run must have, on random traces, policies and cache sizes (hypothesis)."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.config import get_preset
from core.roofline import get_gpu
from sim.cost import ConstantCost, RooflineCost
from core.kv import BlockPool, PrefixBlockPool, blocks_for
from core.routers import LeastKVLoad, LeastOutstanding, PowerOfTwo, RoundRobin
from core.scheduler import ChunkedPrefill, ContinuousBatching, DecodePriority, StaticBatching, shortest_prompt_first
from sim.replica import SwapLink
from sim.run import Disaggregation, simulate
from traces.trace import Trace

COSTS = [RooflineCost(get_preset("qwen2.5-1.5b"), get_gpu("h200")), ConstantCost(0.01)]


def make_scheduler(policy: str, blocks: int, block_size: int, swap: bool, max_num_seqs: int):
    def build():
        cache_len = blocks * block_size
        kv = (PrefixBlockPool(blocks, block_size, hash_block_tokens=block_size * 2) if policy == "prefix"
              else BlockPool(blocks, block_size))
        preemption = "swap" if swap and policy != "prefix" else "recompute"
        if policy == "static":
            return StaticBatching(kv, batch_size=max_num_seqs, timeout_s=0.05, max_model_len=cache_len,
                                  preemption=preemption)
        if policy == "chunked":
            return ChunkedPrefill(kv, max_num_seqs, max(max_num_seqs, 32), cache_len, preemption=preemption)
        if policy == "decode-priority":
            return DecodePriority(kv, max_waiting_passes=3, max_num_seqs=max_num_seqs, max_model_len=cache_len,
                                  preemption=preemption)
        return ContinuousBatching(kv, max_num_seqs, max_model_len=cache_len,
                                  order=shortest_prompt_first if policy == "spf" else None, preemption=preemption)
    return build


scenario = st.fixed_dictionaries({
    "seed": st.integers(0, 2**32 - 1),
    "n": st.integers(1, 25),
    "rate": st.sampled_from([1.0, 50.0, 1000.0]),
    "policy": st.sampled_from(["static", "continuous", "chunked", "decode-priority", "spf", "prefix"]),
    "blocks": st.integers(4, 60),
    "block_size": st.sampled_from([1, 4, 16]),
    "swap": st.booleans(),
    "max_num_seqs": st.integers(1, 8),
    "replicas": st.integers(1, 3),
    "cost": st.sampled_from([0, 1]),
    "router": st.sampled_from([RoundRobin, LeastOutstanding, LeastKVLoad, PowerOfTwo]),
    "disaggregate": st.booleans(),
})


def trace_for(s) -> Trace:
    """Arrivals drawn from a seed (continuous values: no exact ties with pass boundaries);
    some requests larger than the whole cache, to be rejected."""
    rng = np.random.default_rng(s["seed"])
    n, cap = s["n"], s["blocks"] * s["block_size"]
    prompt = rng.integers(1, max(2, cap), n)
    output = rng.integers(1, max(2, cap // 2), n)
    hashes = [[int(h) for h in rng.integers(0, 3, 8)] for _ in range(n)]  # few distinct prefixes
    return Trace(np.cumsum(rng.exponential(1 / s["rate"], n)), prompt, output, block_hashes=hashes)


def run(s, fast_forward=True):
    make = make_scheduler(s["policy"], s["blocks"], s["block_size"], s["swap"], s["max_num_seqs"])
    disaggregate = None
    if s["disaggregate"] and s["policy"] != "static":  # prefill replicas of the policy, decode ones chunked
        disaggregate = Disaggregation(s["replicas"], 2, make_scheduler("chunked", s["blocks"], s["block_size"],
                                                                       s["swap"], s["max_num_seqs"]),
                                      kv_bytes_per_token=1000, link_bytes_per_s=1e9, link_latency_s=1e-3,
                                      decode_router=router(s["router"], 1))
    return simulate(trace_for(s), make, COSTS[s["cost"]], s["replicas"], router(s["router"], 0),
                    disaggregate=disaggregate, keep_token_times=True, log_passes=True, fast_forward=fast_forward,
                    swap_link=SwapLink(1000, 1e9))


def router(cls, seed: int):
    return cls(seed) if cls is PowerOfTwo else cls()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario)
def test_every_run_ends_every_request_within_the_cache(s):
    res = run(s)
    cap_tokens = s["blocks"] * s["block_size"]
    for r in res.requests:
        if r.rejected is not None:
            assert r.prompt_tokens + r.max_output_tokens > cap_tokens and r.output_tokens == 0
            continue
        assert r.completed and r.output_tokens == r.max_output_tokens
        times = r.token_times_s
        assert times[0] > r.arrival_s
        assert all(b >= a for a, b in zip(times, times[1:]))
        assert r.first_token_s == times[0] and r.finish_s == times[-1]
    assert all(peak <= s["blocks"] for peak in res.peak_kv_blocks)
    if s["policy"] != "prefix" and not s["disaggregate"]:  # without sharing, distinct blocks per pass
        bs = s["block_size"]
        for p in res.passes:
            held = sum(blocks_for(c + n, bs) for c, n in zip(p.context_lens, p.new_tokens))
            assert held <= s["blocks"], p


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario)
def test_same_seed_same_records_and_fast_forward_changes_nothing(s):
    a, b, step = run(s), run(s), run(s, fast_forward=False)
    assert a.requests == b.requests and a.passes == b.passes
    assert len(a.passes) == len(step.passes)
    for x, y in zip(a.requests, step.requests):
        assert (x.output_tokens, x.preemptions, x.rejected, x.replica) == \
               (y.output_tokens, y.preemptions, y.rejected, y.replica)
        assert np.allclose(x.token_times_s, y.token_times_s, rtol=1e-9, atol=0)
