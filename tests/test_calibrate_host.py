"""calibrate/host.py: which passes count as starts on an idle engine, by hand-built pass logs."""
import pytest

from calibrate.host import IdleStart, fixed_time, idle_starts
from core.records import PassRecord, RequestRecord
from sim.cost import ConstantCost

COST = 0.002


def one_pass(step, start, new_tokens, context_lens):
    return PassRecord("r", "continuous", step, "prefill" if all(n > 1 for n in new_tokens) else "decode",
                      list(new_tokens), list(context_lens), start, COST, host_s=1e-4)


def test_a_pass_after_an_arrival_is_an_idle_start_only_if_it_takes_the_prompt_in():
    passes = [one_pass(0, 0.0005, [64], [0]),             # the run's first pass: planned at 0
              one_pass(1, 0.0030, [1], [64]),             # decode, back to back
              one_pass(2, 0.0051, [1], [65]),             # decode planned before the arrival at 0.00505
              one_pass(3, 0.0200, [32], [0])]             # after a sleep: takes in the request of 0.0190
    requests = [RequestRecord("a", 0.0, 64, 3), RequestRecord("b", 0.00505, 32, 1),
                RequestRecord("c", 0.0190, 32, 1)]
    starts = idle_starts([({}, passes, requests)], ConstantCost(COST))
    assert [(s.tokens, s.woke) for s in starts] == [(64, False), (32, True)]
    # late: from when it was planned (0, the arrival) to its end, less its price
    assert [s.late_s for s in starts] == pytest.approx([0.0005, 0.0010])
    assert [s.started_s for s in starts] == pytest.approx([0.0005, 0.0010])  # from planned to its start


def test_fixed_host_time_is_the_first_passes_lateness_but_never_less_than_the_host_logged():
    """An 8B model's first passes (tens of ms) priced a few percent long leave end - planned -
    predicted below 0; the host still took the time before the GPU started."""
    short = [IdleStart(256, 1e-4, late, False, 2e-4) for late in (6e-4, 7e-4, 8e-4)]
    assert fixed_time(short) == pytest.approx(7e-4)
    long = [IdleStart(1024, 1e-4, late, False, started) for late, started in ((-1.2e-3, 2e-4), (-0.9e-3, 2.5e-4),
                                                                            (-1.1e-3, 1.5e-4))]
    assert fixed_time(long) == pytest.approx(2e-4)
