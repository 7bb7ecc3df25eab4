"""The engine's host time in the simulator (sim/host.py) and the replay of measured pass times
(sim/replay.py), by hand-computed cases."""
import math

import pytest

from core.kv import BlockPool
from core.scheduler import ContinuousBatching
from sim.cost import ConstantCost
from sim.host import HostTime
from sim.replay import Diverged, MeasuredPasses
from sim.run import simulate
from tests.sim_helpers import trace_of


class Hosted(ConstantCost):
    def __init__(self, seconds, host):
        super().__init__(seconds)
        self.host = host


def sched():
    return ContinuousBatching(BlockPool(1000, 16), max_num_seqs=8, max_num_batched_tokens=4096, max_model_len=2048)


def run(rows, cost, overlap=True):
    return simulate(trace_of(rows), sched, cost, keep_token_times=True, log_passes=True, overlap=overlap,
                    fast_forward=False)


def test_idle_start_pays_the_host_time_and_a_sleep_the_wake():
    host = HostTime(fixed_s=0.001, per_token_s=1e-6, wake_s=0.0005)
    # at t=0 the replica never slept: 1 ms; at t=1 it had slept: 1 ms + 0.5 ms wake
    r = run([(0.0, 100, 3), (1.0, 100, 3)], Hosted(0.01, host))
    first, second = sorted(r.requests, key=lambda x: x.arrival_s)
    assert math.isclose(first.ttft_s, 0.001 + 0.01)
    assert math.isclose(second.ttft_s, 0.0015 + 0.01)
    # taken in on arrival; each first pass starts after the host time (and the wake)
    assert (first.queued_s, first.scheduled_s) == (0.0, 0.001)
    assert second.queued_s == 1.0 and math.isclose(second.scheduled_s, 1.0015)
    # the passes after the first are planned while one runs: no delay, 10 ms apart
    assert math.isclose(first.token_times_s[1] - first.token_times_s[0], 0.01)
    # a large pass: per token beyond the fixed time (1900 tokens x 1 us = 1.9 ms > 1 ms)
    big = run([(0.0, 1900, 2)], Hosted(0.01, host)).requests[0]
    assert math.isclose(big.ttft_s, 0.0019 + 0.01)


def test_no_host_is_the_old_simulator():
    rows = [(0.0, 100, 4), (0.013, 50, 4), (0.5, 10, 2)]
    a = run(rows, ConstantCost(0.01))
    b = run(rows, Hosted(0.01, HostTime()))
    assert [x.token_times_s for x in a.requests] == [x.token_times_s for x in b.requests]


def test_retire_lag_lets_a_request_just_after_a_pass_end_join_the_next_plan():
    # passes of 10 ms from t=0 (request A); B arrives 20 us after pass 1 ended (t=0.02002):
    # without the lag overlap plans pass 3 (0.03-0.04) before seeing it -> B's prefill is pass 4;
    # with a 30 us lag the plan of pass 3 sees it
    rows = [(0.0, 100, 10), (0.02002, 100, 3)]
    late = [x for x in run(rows, ConstantCost(0.01)).requests if x.arrival_s > 0][0]
    early = [x for x in run(rows, Hosted(0.01, HostTime(retire_s=30e-6))).requests if x.arrival_s > 0][0]
    assert math.isclose(late.first_token_s, 0.05)
    assert math.isclose(early.first_token_s, 0.04)
    # taken in by the plan that saw it: pass 3's (at pass 2's start + 30 us), or pass 4's (at 0.03)
    assert math.isclose(early.queued_s, 0.02003) and math.isclose(early.scheduled_s, 0.03)
    assert math.isclose(late.queued_s, 0.03) and math.isclose(late.scheduled_s, 0.04)


@pytest.mark.parametrize("b_arrives, first_token", [(0.012, 0.04), (0.016, 0.06)])
def test_the_next_plan_waits_for_a_pass_launched_kernel_by_kernel(b_arrives, first_token):
    # A's 2,000-token prompt is past the largest graph (1,000 tokens): its launch keeps the host
    # 15 ms, so the plan made while pass 1 (0-20 ms) runs is made at 15 ms and sees B if B came by
    # then (B's prefill is pass 2, first token at 40 ms); otherwise pass 3 (60 ms)
    host = HostTime(eager_launch_s=0.015, graph_tokens=1000)
    rows = [(0.0, 2000, 4), (b_arrives, 100, 2)]
    b = [x for x in run(rows, Hosted(0.02, host)).requests if x.arrival_s > 0][0]
    assert math.isclose(b.first_token_s, first_token)
    without = [x for x in run(rows, ConstantCost(0.02)).requests if x.arrival_s > 0][0]
    assert math.isclose(without.first_token_s, 0.06)


def test_launch_time_by_pass_size():
    from core.scheduler import ScheduledPass
    host = HostTime(launch_s=0.0005, eager_launch_s=0.015, graph_tokens=8192)
    assert host.launch_time(ScheduledPass([], [8192], [0])) == 0.0005
    assert host.launch_time(ScheduledPass([], [8000, 193], [0, 0])) == 0.015
    assert HostTime(launch_s=0.0005, eager_launch_s=0.015).launch_time(ScheduledPass([], [9000], [0])) == 0.0005


@pytest.mark.parametrize("bad", [{"fixed_s": -1}, {"fixed_s": float("nan")}, {"wake": 0.1}, [1], {"fixed_s": 2.0},
                                 {"graph_tokens": -1}, {"graph_tokens": 1.5}, {"eager_launch_s": 3.0}])
def test_bad_host_fields_are_named(bad):
    with pytest.raises(ValueError, match="host"):
        HostTime.from_dict(bad)


def test_replay_of_a_runs_own_pass_times_coincides_and_catches_a_different_rule():
    rows = [(0.0, 100, 20), (0.0305, 40, 10), (0.0412, 300, 5), (0.3, 16, 4), (0.3004, 64, 6)]
    real = run(rows, ConstantCost(0.01), overlap=True)
    arrivals = [r.arrival_s for r in real.requests]
    same = MeasuredPasses(real.passes, arrivals)
    simulate(trace_of(rows), sched, same, overlap=True, fast_forward=False)
    assert same.index == len(real.passes)
    other = MeasuredPasses(real.passes, arrivals)
    with pytest.raises(Diverged) as e:  # without overlap the request at 30.5 ms joins a pass earlier
        simulate(trace_of(rows), sched, other, overlap=False, fast_forward=False)
    assert e.value.index == 4 and e.value.real[0] == [1] and e.value.sim[0] == [40]
