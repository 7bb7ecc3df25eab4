"""Windows, rate scaling, context clipping and summaries on small traces with known answers."""
from __future__ import annotations

import numpy as np
import pytest

from traces.tools import clip_to_context, rate_per_window, scale_rate, summary, window
from traces.trace import Trace


def small_trace() -> Trace:
    return Trace(arrival_s=np.array([0.0, 1.0, 2.0, 4.0, 8.0]),
                 prompt_tokens=np.array([10, 20, 30, 40, 50]),
                 output_tokens=np.array([1, 2, 3, 4, 5]),
                 request_id=list("abcde"), priority=np.array([0, 1, 0, 1, 0]),
                 block_hashes=[[1], [2], [3], [4], [5]], name="small")


def test_window_keeps_half_open_interval_rebased_with_all_columns():
    cut = window(small_trace(), 1.0, 4.0)
    assert cut.arrival_s.tolist() == [0.0, 1.0]
    assert cut.request_id == ["b", "c"]
    assert cut.priority.tolist() == [1, 0]
    assert cut.block_hashes == [[2], [3]]
    assert window(small_trace(), 0.5, 4.5, rebase=False).arrival_s.tolist() == [1.0, 2.0, 4.0]


def test_window_rejects_an_empty_interval():
    with pytest.raises(ValueError, match="after its start"):
        window(small_trace(), 3.0, 3.0)


def test_scale_rate_hits_the_target_rate_and_keeps_gap_shape():
    trace = small_trace()  # 4 gaps over 8 s = 0.5 req/s
    faster = scale_rate(trace, 2.0)
    assert faster.rate == pytest.approx(2.0)
    assert faster.arrival_s.tolist() == [0.0, 0.25, 0.5, 1.0, 2.0]
    assert scale_rate(trace, 0.25).arrival_s.tolist() == [0.0, 2.0, 4.0, 8.0, 16.0]
    assert faster.prompt_tokens.tolist() == trace.prompt_tokens.tolist()


def test_scale_rate_refuses_a_trace_without_span():
    one = Trace(np.array([3.0]), np.array([1]), np.array([1]))
    with pytest.raises(ValueError, match="no time span"):
        scale_rate(one, 1.0)


def test_clip_drops_prompts_that_fill_the_context_and_shortens_outputs():
    trace = Trace(arrival_s=np.arange(5.0), prompt_tokens=np.array([100, 95, 90, 99, 10]),
                  output_tokens=np.array([5, 5, 20, 1, 50]), request_id=list("abcde"))
    clipped, report = clip_to_context(trace, 100)
    assert clipped.request_id == ["b", "c", "d", "e"]  # "a": prompt == context, no room to generate
    assert clipped.output_tokens.tolist() == [5, 10, 1, 50]
    assert (clipped.prompt_tokens + clipped.output_tokens).max() <= 100
    assert (report.kept, report.dropped, report.clipped, report.output_tokens_removed) == (4, 1, 1, 10)


def test_clip_changes_nothing_when_everything_fits():
    clipped, report = clip_to_context(small_trace(), 32768)
    assert (report.dropped, report.clipped) == (0, 0)
    assert clipped.output_tokens.tolist() == small_trace().output_tokens.tolist()


def test_rate_per_window_divides_every_window_by_its_full_length():
    trace = Trace(np.array([0.0, 1.0, 59.0, 60.0, 130.0]), np.ones(5), np.ones(5))
    assert rate_per_window(trace, 60.0).tolist() == [3 / 60, 1 / 60, 1 / 60]


def test_summary_of_a_long_span_allocates_by_requests_not_by_seconds(monkeypatch):
    """A trace over 1e8 s has 1.7 million minutes; the busiest one is found among the two that
    hold a request, and rate_per_window refuses a window count it would not allocate."""
    trace = Trace(np.array([0.0, 1.0, 1e8]), np.ones(3), np.ones(3))
    monkeypatch.setattr(np, "bincount", None)  # a dense count over every minute would fail here
    assert summary(trace)["busiest_minute_rate"] == pytest.approx(2 / 60)
    with pytest.raises(ValueError, match="at most 10,000,000 windows"):
        rate_per_window(trace, 1.0)


def test_summary_reports_rate_busiest_minute_and_percentiles():
    arrivals = np.concatenate([np.linspace(0, 59, 30), np.linspace(60, 119, 90)])
    trace = Trace(arrivals, np.arange(1, 121), np.full(120, 7), name="s")
    stats = summary(trace)
    assert stats["requests"] == 120
    assert stats["span_s"] == pytest.approx(119.0)
    assert stats["mean_rate"] == pytest.approx(119 / 119.0)
    assert stats["busiest_minute_rate"] == pytest.approx(90 / 60)
    assert stats["prompt_p50"] == pytest.approx(60.5)
    assert stats["prompt_max"] == 120 and stats["output_p99"] == 7
