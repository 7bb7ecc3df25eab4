"""Routers in front of replicas, and prefill/decode disaggregation."""
import numpy as np
import pytest

from core.routers import LeastKVLoad, LeastOutstanding, PowerOfTwo, RoundRobin
from sim.cost import ConstantCost
from core.kv import BlockPool
from core.scheduler import ChunkedPrefill, ContinuousBatching
from sim.run import Disaggregation
from sim_helpers import checked_run, token_times, trace_of

ONE = ConstantCost(1.0)


def kv():
    return BlockPool(100, block_size=4)


def replicas_of(res):
    return [r.replica for r in res.requests]


def test_round_robin_takes_turns():
    res = checked_run(trace_of([(i * 0.1, 4, 2) for i in range(7)]), lambda: ContinuousBatching(kv()), ONE,
                      replicas=3, router=RoundRobin())
    assert replicas_of(res) == [0, 1, 2, 0, 1, 2, 0]


def test_least_outstanding_avoids_the_busy_replica():
    # A keeps replica 0 busy. B goes to 1; C finds one request on each (a tie: the lower index);
    # D finds two on 0; E comes after C and D have finished (t=4 and 4.5).
    rows = [(0, 4, 50), (0.5, 4, 2), (1.5, 4, 2), (1.6, 4, 2), (4.7, 4, 2)]
    res = checked_run(trace_of(rows), lambda: ContinuousBatching(kv()), ONE, replicas=2, router=LeastOutstanding())
    assert replicas_of(res) == [0, 1, 0, 1, 1]


def test_least_kv_load_counts_blocks_used_mid_run():
    # replica 0 holds a long prompt; by t=30 its decode has grown it further, still the fuller one
    rows = [(0, 300, 60), (0.5, 4, 100), (30.5, 4, 2)]
    res = checked_run(trace_of(rows), lambda: ContinuousBatching(BlockPool(200, block_size=4)), ONE,
                      replicas=2, router=LeastKVLoad())
    assert replicas_of(res) == [0, 1, 1]


def test_power_of_two_is_seeded_and_with_two_replicas_is_least_outstanding():
    rows = [(i * 0.3, 4, int(n)) for i, n in enumerate(np.random.default_rng(0).integers(1, 30, 40))]
    p2 = checked_run(trace_of(rows), lambda: ContinuousBatching(kv()), ONE, replicas=2, router=PowerOfTwo(5))
    lo = checked_run(trace_of(rows), lambda: ContinuousBatching(kv()), ONE, replicas=2, router=LeastOutstanding())
    assert replicas_of(p2) == replicas_of(lo)
    a = checked_run(trace_of(rows), lambda: ContinuousBatching(kv()), ONE, replicas=4, router=PowerOfTwo(5))
    b = checked_run(trace_of(rows), lambda: ContinuousBatching(kv()), ONE, replicas=4, router=PowerOfTwo(5))
    assert replicas_of(a) == replicas_of(b) and len(set(replicas_of(a))) == 4


def test_disaggregation_pays_the_kv_transfer_between_first_and_second_token():
    # 1 byte per token over a 2 bytes/s link with 0.5 s latency: a 4-token prompt's cache takes
    # 2.5 s. Prefill 0->1 (first token), transfer 1->3.5, decode passes 3.5->4.5->5.5.
    d = Disaggregation(1, 1, lambda: ChunkedPrefill(kv(), max_num_seqs=8, max_num_batched_tokens=8),
                       kv_bytes_per_token=1, link_bytes_per_s=2, link_latency_s=0.5)
    res = checked_run(trace_of([(0, 4, 3), (0, 2, 1)]), lambda: ContinuousBatching(kv()), ONE, disaggregate=d)
    assert token_times(res) == {"0": [1, 4.5, 5.5], "1": [1]}
    assert replicas_of(res) == [1, 0]  # the second needed only its first token: done on prefill
    assert [(p.replica, p.kind) for p in res.passes] == [(0, "prefill"), (1, "decode"), (1, "decode")]


def test_disaggregation_frees_the_prefill_cache_only_once_sent():
    # The prefill replica's cache holds one prompt: the second waits for the first's transfer.
    d = Disaggregation(1, 1, lambda: ChunkedPrefill(kv(), max_num_seqs=8, max_num_batched_tokens=8),
                       kv_bytes_per_token=1, link_bytes_per_s=1, link_latency_s=0)
    res = checked_run(trace_of([(0, 8, 2), (0, 8, 2)]),
                      lambda: ContinuousBatching(BlockPool(3, block_size=4), max_model_len=12), ONE, disaggregate=d)
    assert token_times(res) == {"0": [1, 10], "1": [10, 19]}


def test_disaggregation_rejects_what_the_decode_side_cannot_hold():
    d = Disaggregation(1, 1, lambda: ChunkedPrefill(BlockPool(3, block_size=4), max_num_seqs=4,
                                                    max_num_batched_tokens=8), kv_bytes_per_token=1)
    res = checked_run(trace_of([(0, 8, 8)]), lambda: ContinuousBatching(kv()), ONE, disaggregate=d)
    assert "exceeds max_model_len 12" in res.requests[0].rejected


def test_a_trace_out_of_time_order_is_a_clear_error():
    with pytest.raises(ValueError, match="arrivals must be in time order, but request 2"):
        checked_run(trace_of([(0, 4, 2), (2, 4, 2), (1, 4, 2)]), lambda: ContinuousBatching(kv()), ONE)
