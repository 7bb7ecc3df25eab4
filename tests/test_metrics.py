"""core.metrics: vLLM's definitions, checked on records small enough to compute by hand."""
import math

import pytest

from core.metrics import compute_metrics, parse_goodput
from core.records import RequestRecord


def served(rid, arrival, times, prompt=10):
    r = RequestRecord(rid, arrival, prompt, len(times))
    r.set_token_times(times)
    return r


def test_latencies_and_throughput_by_hand():
    a = served("a", 0.0, [0.1, 0.2, 0.4])        # TTFT 0.1, TPOT 0.15, E2EL 0.4, ITLs 0.1 0.2
    b = served("b", 0.5, [0.8, 0.9])             # TTFT 0.3, TPOT 0.1, E2EL 0.4, ITL 0.1
    m = compute_metrics([a, b])
    assert m.ttft.mean == pytest.approx(0.2)
    assert m.tpot.mean == pytest.approx(0.125)
    assert m.e2el.median == pytest.approx(0.4)
    assert m.itl.mean == pytest.approx(0.4 / 3)
    assert m.duration_s == pytest.approx(0.9)    # first arrival 0.0 to last response 0.9
    assert m.request_throughput == pytest.approx(2 / 0.9)
    assert m.output_throughput == pytest.approx(5 / 0.9)
    assert m.total_token_throughput == pytest.approx(25 / 0.9)


def test_ttfts_stages_by_hand_and_none_when_untimed():
    a = served("a", 0.0, [0.1, 0.2])               # taken in at 0.01, first pass at 0.04: 10 + 30 + 60 ms
    a.queued_s, a.scheduled_s = 0.01, 0.04
    b = served("b", 0.5, [0.8, 0.9])               # 0 + 100 + 200 ms
    b.queued_s, b.scheduled_s = 0.5, 0.6
    m = compute_metrics([a, b])
    assert (m.intake.mean, m.queue.mean, m.prefill.mean) == pytest.approx((0.005, 0.065, 0.13))
    assert m.intake.mean + m.queue.mean + m.prefill.mean == pytest.approx(m.ttft.mean)
    row = m.as_row()
    assert row["median_queue_ms"] == pytest.approx(65.0) and row["p99_prefill_ms"] == pytest.approx(60 + 0.99 * 140)
    b.scheduled_s = None                           # one request untimed: no stages at all
    m = compute_metrics([a, b])
    assert m.intake is m.queue is m.prefill is None and "mean_intake_ms" not in m.as_row()


def test_duration_runs_to_the_last_response_rejections_included():
    """vLLM's benchmark duration ends at the last response, a failed request's included: a
    request refused after the last completion lengthens the run."""
    a = served("a", 0.0, [0.1, 0.2])
    late = RequestRecord("late", 2.0, 10**6, 5, rejected="prompt longer than max_model_len")
    m = compute_metrics([a, late])
    assert m.duration_s == pytest.approx(2.0)
    assert m.completed == 1 and m.rejected == 1
    assert m.request_throughput == pytest.approx(0.5)


def test_only_rejections_give_zero_throughput_over_their_span():
    m = compute_metrics([RequestRecord("x", 1.0, 10, 5, rejected="too long"),
                         RequestRecord("y", 3.0, 10, 5, rejected="too long")])
    assert m.duration_s == pytest.approx(2.0) and m.request_throughput == 0.0
    assert math.isnan(m.ttft.mean)


@pytest.mark.parametrize("spec", ["ttft:nan", "ttft:inf", "tpot:0", "e2el:-5"])
def test_a_goodput_slo_must_be_a_positive_finite_number(spec):
    with pytest.raises(ValueError, match=f"goodput SLO '{spec}': must be a positive, finite number"):
        parse_goodput([spec])


def test_goodput_counts_requests_meeting_every_slo():
    a = served("a", 0.0, [0.1, 0.2, 0.4])        # TTFT 100 ms, TPOT 150 ms
    b = served("b", 0.5, [0.8, 0.9])             # TTFT 300 ms, TPOT 100 ms
    slos = parse_goodput(["ttft:200", "tpot:200"])  # seconds
    assert compute_metrics([a, b], slos).goodput == pytest.approx(1 / 0.9)


def test_rejections_are_told_by_kind_of_reason_with_their_first_ids():
    from core.metrics import format_rejections
    assert format_rejections([served("a", 0.0, [0.1])]) is None
    refused = [RequestRecord(f"r{i}", i, 10**5 + i, 5, rejected=f"prompt {10**5 + i} exceeds max_model_len 32768")
               for i in range(5)] + [RequestRecord("k", 9.0, 10, 5, rejected="no KV blocks")]
    lines = format_rejections(refused).splitlines()
    assert lines == ["5 requests rejected (r0, r1, r2, ...): e.g. prompt 100000 exceeds max_model_len 32768",
                     "1 request rejected (k): no KV blocks"]


def test_the_table_prints_the_percentiles_asked_for():
    from core.metrics import format_metrics
    m = compute_metrics([served("a", 0.0, [0.1, 0.2, 0.4]), served("b", 0.5, [0.8, 0.9])], percentiles=(25, 50, 99))
    default, chosen = format_metrics(m), format_metrics(m, shown=[25])
    assert "P99 TTFT (ms):" in default and "P25 TTFT (ms):" in default and "P50 TTFT" not in default
    assert "P25 TTFT (ms):" in chosen and "P99 TTFT" not in chosen
    assert f"{m.ttft.percentiles[25] * 1e3:<10.2f}" in chosen.split("P25 TTFT (ms):")[1].splitlines()[0]
