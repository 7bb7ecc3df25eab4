"""Cutting and reshaping traces: time windows, rate scaling, clipping to a model's context, and
the summary numbers a report quotes (rate, busiest minute, token percentiles)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Iterator

import numpy as np

from traces.generate import gamma
from traces.trace import Trace


def window(trace: Trace, start_s: float, end_s: float, rebase: bool = True) -> Trace:
    """The requests arriving in [start_s, end_s); with `rebase`, times are shifted so that
    `start_s` becomes 0 (a gap before the first request in the window is kept)."""
    if end_s <= start_s:
        raise ValueError(f"window end {end_s} must be after its start {start_s}")
    cut = trace.take((trace.arrival_s >= start_s) & (trace.arrival_s < end_s))
    if rebase:
        cut.arrival_s = cut.arrival_s - start_s
    cut.name = f"{trace.name}[{start_s:g}s,{end_s:g}s)"
    return cut


def scale_rate(trace: Trace, target_rate: float) -> Trace:
    """Stretch or compress time (around t = 0) so that the mean rate, (n - 1) / span as in
    `Trace.rate`, becomes `target_rate`; gaps keep their shape, only their scale changes."""
    if not target_rate > 0 or not np.isfinite(target_rate):
        raise ValueError(f"target rate must be a positive number, got {target_rate}")
    if not trace.span_s > 0:
        raise ValueError(f"trace {trace.name!r} has no time span (fewer than two distinct "
                         "arrival times), so it has no rate to scale")
    factor = trace.rate / target_rate
    return replace(trace, arrival_s=trace.arrival_s * factor, notes={},
                   name=f"{trace.name}@{target_rate:g}rps")


@dataclass
class ClipReport:
    """What `clip_to_context` changed."""

    kept: int
    dropped: int  # prompt alone fills the context: no room for one output token
    clipped: int  # output shortened so that prompt + output fits
    output_tokens_removed: int  # across the clipped requests


def clip_to_context(trace: Trace, context_length: int) -> tuple[Trace, ClipReport]:
    """Make every request fit a model's context: drop those whose prompt is >= context_length,
    cut the output of those whose prompt + output exceeds it. Returns the trace and the counts."""
    if context_length < 2:
        raise ValueError(f"context length must be at least 2 tokens, got {context_length}")
    fits = trace.prompt_tokens < context_length
    kept = trace.take(fits)
    room = context_length - kept.prompt_tokens
    over = kept.output_tokens > room
    report = ClipReport(kept=len(kept), dropped=int((~fits).sum()), clipped=int(over.sum()),
                        output_tokens_removed=int((kept.output_tokens - room)[over].sum()))
    kept.output_tokens = np.minimum(kept.output_tokens, room)
    kept.name = f"{trace.name}|ctx{context_length}"
    return kept, report


MAX_DENSE_WINDOWS = 10_000_000  # rate_per_window's array, 80 MB; summary's busiest minute needs none


def rate_per_window(trace: Trace, window_s: float = 600.0) -> np.ndarray:
    """Requests per second in consecutive windows of `window_s` from the first arrival. Every
    window, the last (usually partial) one included, is divided by the full `window_s`."""
    if len(trace) == 0:
        return np.zeros(0)
    if not window_s > 0 or trace.span_s / window_s > MAX_DENSE_WINDOWS:
        raise ValueError(f"window of {window_s:g} s over a span of {trace.span_s:g} s: expected a positive window "
                         f"and at most {MAX_DENSE_WINDOWS:,} windows")
    offsets = trace.arrival_s - trace.arrival_s[0]
    counts = np.bincount((offsets // window_s).astype(np.int64))
    return counts / window_s


def busiest_window_rate(trace: Trace, window_s: float = 60.0) -> float:
    """The highest rate of `rate_per_window(trace, window_s)`, counted over the windows that hold
    a request, so that memory grows with the requests, not with the span."""
    if len(trace) == 0:
        return 0.0
    windows = ((trace.arrival_s - trace.arrival_s[0]) // window_s).astype(np.int64)
    return float(np.unique(windows, return_counts=True)[1].max() / window_s)


def summary(trace: Trace) -> dict[str, float | int | str]:
    """Requests, span, mean rate, busiest one-minute window (fixed minutes from the first
    arrival) and token percentiles: the numbers to check a trace against before replaying it."""
    stats: dict[str, float | int | str] = {
        "name": trace.name, "requests": len(trace), "span_s": trace.span_s,
        "mean_rate": trace.rate,
        "busiest_minute_rate": busiest_window_rate(trace, 60.0),
    }
    for label, tokens in (("prompt", trace.prompt_tokens), ("output", trace.output_tokens)):
        p50, p90, p99 = np.percentile(tokens, [50, 90, 99]) if len(trace) else (0.0, 0.0, 0.0)
        stats |= {f"{label}_p50": float(p50), f"{label}_p90": float(p90), f"{label}_p99": float(p99),
                  f"{label}_max": int(tokens.max()) if len(trace) else 0}
    stats |= {f"note_{key}": value for key, value in trace.notes.items()}
    return stats


def shape_arrivals(trace: Trace, rate: float | None, rate_scale: float, limit: int | None, seed: int,
                   burstiness: float = 1.0) -> Trace:
    """The trace's first `limit` requests, arriving either as a Poisson process at `rate` (seeded,
    first at t = 0; the lengths keep their order; gamma gaps of shape `burstiness` as vLLM's
    benchmark draws them, 1 being Poisson) or at the trace's own times, sped up `rate_scale` times."""
    if limit is not None and limit < len(trace):
        trace = trace.take(np.arange(limit))
    if rate is not None:
        arrival = gamma(rate, burstiness, n=len(trace), seed=seed).arrival_s
    elif rate_scale != 1.0:
        arrival = (trace.arrival_s - (trace.arrival_s[0] if len(trace) else 0.0)) / rate_scale
    else:
        return trace
    return Trace(arrival, trace.prompt_tokens, trace.output_tokens, trace.request_id, trace.priority,
                 trace.block_hashes, trace.name)


def shape_chunks(chunks: Iterable[Trace], rate: float | None, rate_scale: float, limit: int | None, seed: int,
                 count: int | None = None, burstiness: float = 1.0) -> Iterator[Trace]:
    """`shape_arrivals` for a trace read a chunk at a time (`traces.io.iter_trace`): the same
    arrival times, chunk by chunk. Poisson arrivals at `rate` need the trace's length, `count`."""
    arrival = None
    if rate is not None:
        if count is None:
            raise ValueError("Poisson arrivals over a streamed trace need its length")
        arrival = gamma(rate, burstiness, n=min(count, limit or count), seed=seed).arrival_s  # 8 bytes a request
    left = limit
    first = None
    done = 0
    for chunk in chunks:
        if left is not None:
            if left <= 0:
                return
            if len(chunk) > left:
                chunk = chunk.take(np.arange(left))
            left -= len(chunk)
        if arrival is not None:
            chunk = replace(chunk, arrival_s=arrival[done:done + len(chunk)], notes={})
        elif rate_scale != 1.0:
            first = chunk.arrival_s[0] if first is None else first
            chunk = replace(chunk, arrival_s=(chunk.arrival_s - first) / rate_scale, notes={})
        done += len(chunk)
        yield chunk
