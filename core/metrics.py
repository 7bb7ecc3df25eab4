"""Serving metrics from request records, with vLLM's definitions (vllm/benchmarks/serve.py).

One function, `compute_metrics`, serves real runs and simulated runs alike:

- TTFT: first token time - arrival, per request.
- TPOT: (E2EL - TTFT) / (output_tokens - 1), per request with at least 2 output tokens.
- ITL: every gap between consecutive output tokens, pooled over all requests.
- E2EL: last token time - arrival, per request.
- request / output-token / total-token throughput: counts over the run's duration, vLLM's
  benchmark duration: from the start (the first request's arrival: vLLM sends its first request
  at once) to the last response, a rejected request's refusal included.
- goodput: completed requests that meet every given SLO (ttft, tpot, e2el; milliseconds, as
  vLLM's `--goodput ttft:MS tpot:MS`), per second.
- TTFT's stages, where the records have the times they need (the continuous engine's, and a
  simulation's that keeps token times), as vLLM's queued and scheduled timestamps split it:
  intake (taken in - arrival), queue (first pass start - taken in) and prefill (first token -
  first pass start), per completed request; they add up to its TTFT.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence, Sized

import numpy as np

from core.records import RequestRecord
from core.request_table import RequestTable

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
SLO_METRICS = ("ttft", "tpot", "e2el")
STAGES = ("intake", "queue", "prefill")  # TTFT's parts, when recorded


@dataclass
class Distribution:
    """mean, median, std and chosen percentiles of one latency metric, in seconds."""

    count: int
    mean: float
    median: float
    std: float
    percentiles: dict[float, float] = field(default_factory=dict)

    @classmethod
    def of(cls, values: Sequence[float] | np.ndarray, percentiles: Iterable[float]) -> "Distribution":
        a = np.asarray(values, dtype=float)
        if a.size == 0:
            nan = float("nan")
            return cls(0, nan, nan, nan, {p: nan for p in percentiles})
        return cls(int(a.size), float(a.mean()), float(np.median(a)), float(a.std()),
                   {p: float(np.percentile(a, p)) for p in percentiles})


@dataclass
class Metrics:
    completed: int
    rejected: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    goodput: float | None
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2el: Distribution
    preemptions: int = 0
    intake: Distribution | None = None   # TTFT's stages (STAGES): None when not recorded
    queue: Distribution | None = None
    prefill: Distribution | None = None

    def as_row(self) -> dict:
        """Flat dict with vLLM's key names (latencies in ms), for CSV/JSON and charts."""
        row = {
            "completed": self.completed,
            "rejected": self.rejected,
            "duration_s": self.duration_s,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "request_goodput": self.goodput,
            "preemptions": self.preemptions,
        }
        for name in ("ttft", "tpot", "itl", "e2el", *STAGES):
            d: Distribution | None = getattr(self, name)
            if d is None:
                continue
            row[f"mean_{name}_ms"] = d.mean * 1e3
            row[f"median_{name}_ms"] = d.median * 1e3
            row[f"std_{name}_ms"] = d.std * 1e3
            for p, v in d.percentiles.items():
                row[f"p{p:g}_{name}_ms"] = v * 1e3
        return row


def parse_goodput(specs: Iterable[str]) -> dict[str, float]:
    """`["ttft:200", "tpot:50"]` -> {"ttft": 0.2, "tpot": 0.05} (seconds), as vLLM's flag."""
    slos = {}
    for spec in specs:
        name, sep, ms = spec.partition(":")
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"goodput SLO {spec!r}: expected NAME:MS with NAME one of {SLO_METRICS}")
        try:
            value = float(ms)
        except ValueError:
            raise ValueError(f"goodput SLO {spec!r}: {ms!r} is not a number of milliseconds") from None
        if not 0 < value < math.inf:  # NaN too
            raise ValueError(f"goodput SLO {spec!r}: must be a positive, finite number of milliseconds")
        if name in slos:
            raise ValueError(f"--goodput: {name} is given twice ({name}:{slos[name] * 1e3:g} and {spec}); "
                             "give one SLO per metric")
        slos[name] = value / 1e3
    return slos


def compute_metrics(records: RequestTable | Iterable[RequestRecord], slos: dict[str, float] | None = None,
                    percentiles: Iterable[float] = DEFAULT_PERCENTILES,
                    duration_s: float | None = None) -> Metrics:
    """Metrics over a run's request records, given as records or as a `RequestTable` (the same
    records in columns; records are turned into one, so both give the same numbers). `slos` maps
    ttft/tpot/e2el to seconds; `duration_s` overrides the run's span (first arrival to last response)."""
    t = records if isinstance(records, RequestTable) else RequestTable.from_records(records)
    percentiles = tuple(percentiles)
    done = t.completed_mask()
    rejected = len(t.rejected)
    arrival, first, finish, out = t.arrival_s, t.first_token_s, t.finish_s, t.output_tokens

    started = done & ~np.isnan(first)
    ttfts = first[started] - arrival[started]
    has_tpot = started & (out >= 2)
    tpots = (finish[has_tpot] - first[has_tpot]) / (out[has_tpot] - 1)
    e2els = finish[done] - arrival[done]
    kept = t.token_lengths()
    keep_all = bool(np.all((kept[done] > 0) | (t.itl_count[done] == 0)))
    if keep_all:  # every gap between consecutive token times of the completed requests, in order
        itls = np.zeros(0)
        if t.token_offsets is not None:
            row = np.repeat(np.arange(len(t)), kept)
            same = (row[1:] == row[:-1]) & done[row[:-1]]
            times = t.token_times_s
            itls = (times[1:] - times[:-1])[same]
        itl = Distribution.of(itls, percentiles)
    else:  # some producer kept only the ITL summary: the mean is still exact
        count = int(t.itl_count[done].sum())
        nan = float("nan")
        itl = Distribution(count, sum(t.itl_sum_s[done].tolist()) / count if count else nan,
                           nan, nan, {p: nan for p in percentiles})

    completed = int(done.sum())
    if duration_s is None:  # vLLM's: to the last response, a refusal (at arrival, or when made) included
        refused = t.rejected_mask()
        ends = np.concatenate([finish[done], np.where(np.isnan(finish[refused]), arrival[refused], finish[refused])])
        duration_s = float(ends.max() - arrival.min()) if len(ends) else 0.0
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: float("nan"))

    goodput = None
    if slos:
        with np.errstate(invalid="ignore", divide="ignore"):
            values = {"ttft": np.where(started, first - arrival, np.nan),
                      "tpot": np.where(has_tpot, (finish - first) / (out - 1), np.nan),
                      "e2el": finish - arrival}
        good = done.copy()
        for k, limit in slos.items():
            good &= np.isnan(values[k]) | (values[k] <= limit)  # no value (e.g. one output token): no SLO
        goodput = per_s(int(good.sum()))

    stages = {}
    if t.queued_s is not None and t.scheduled_s is not None:
        queued, scheduled = t.queued_s[started], t.scheduled_s[started]
        if not (np.isnan(queued).any() or np.isnan(scheduled).any()):
            parts = (queued - arrival[started], scheduled - queued, first[started] - scheduled)
            stages = {name: Distribution.of(x, percentiles) for name, x in zip(STAGES, parts)}

    total_in = int(t.prompt_tokens[done].sum())
    total_out = int(out[done].sum())
    return Metrics(
        completed=completed, rejected=rejected, duration_s=duration_s,
        total_input_tokens=total_in, total_output_tokens=total_out,
        request_throughput=per_s(completed), output_throughput=per_s(total_out),
        total_token_throughput=per_s(total_in + total_out), goodput=goodput,
        ttft=Distribution.of(ttfts, percentiles), tpot=Distribution.of(tpots, percentiles),
        itl=itl, e2el=Distribution.of(e2els, percentiles),
        preemptions=int(t.preemptions.sum()), **stages,
    )


def format_rejections(records: RequestTable | Iterable[RequestRecord], examples: int = 3) -> str | None:
    """Why requests were refused (None: none were): one line per kind of reason (reasons alike
    but for their numbers), its count, its first request's reason in full and the first ids."""
    t = records if isinstance(records, RequestTable) else RequestTable.from_records(records)
    if not t.rejected:
        return None
    kinds: dict[str, list[int]] = {}
    for row in sorted(t.rejected):
        kinds.setdefault(re.sub(r"\d+", "#", t.rejected[row]), []).append(row)
    lines = []
    for rows in kinds.values():
        ids = ", ".join(t.ids(r, r + 1)[0] for r in rows[:examples]) + (", ..." if len(rows) > examples else "")
        lines.append(f"{len(rows):,} request{'s' if len(rows) > 1 else ''} rejected ({ids}): "
                     f"{'e.g. ' if len(rows) > 1 else ''}{t.rejected[rows[0]]}")
    return "\n".join(lines)


LATENCIES = ("ttft", "tpot", "itl", "e2el")  # the metrics with percentiles, vLLM's --percentile-metrics names


def format_left_out(left_out: Mapping[str, Sized]) -> str | None:
    """The requests a trace's loader left out, for the metrics table: "3 (2 zero output tokens,
    1 zero prompt tokens)", or None when it left none out. `left_out`: reason -> the rows."""
    counts = {reason: len(rows) for reason, rows in left_out.items() if len(rows)}
    if not counts:
        return None
    if len(counts) == 1:
        return f"{sum(counts.values()):,} ({next(iter(counts))})"
    return f"{sum(counts.values()):,} ({', '.join(f'{n:,} {reason}' for reason, n in counts.items())})"


def left_out_json(left_out: Mapping[str, Iterable[int]]) -> dict[str, dict]:
    """`left_out` (reason -> line numbers) for metrics.json: reason -> {"count", "lines"}."""
    out = {}
    for reason, rows in left_out.items():
        lines = [int(x) for x in rows]
        out[reason] = {"count": len(lines), "lines": lines}
    return out


def format_metrics(m: Metrics, title: str = "Serving Benchmark Result", shown: Iterable[float] | None = None,
                   latencies: Iterable[str] = LATENCIES, left_out: Mapping[str, Sized] | None = None) -> str:
    """A text table laid out like vLLM's benchmark printout: each of the `latencies`' mean, median
    and the percentiles `shown` (default: every one computed but the median); a line for the
    requests the trace's loader `left_out` (reason -> rows), when it left any out."""
    lines = [f"{title:=^60}"]

    def kv(label: str, value, fmt: str = "{:<10.2f}") -> None:
        text = "nan" if isinstance(value, float) and math.isnan(value) else fmt.format(value)
        lines.append(f"{label:<40}{text}")

    kv("Successful requests:", m.completed, "{:<10}")
    kv("Rejected requests:", m.rejected, "{:<10}")
    if left_out and (text := format_left_out(left_out)):
        kv("Left out by the loader:", text, "{}")
    kv("Preemptions:", m.preemptions, "{:<10}")
    kv("Benchmark duration (s):", m.duration_s)
    kv("Total input tokens:", m.total_input_tokens, "{:<10}")
    kv("Total generated tokens:", m.total_output_tokens, "{:<10}")
    kv("Request throughput (req/s):", m.request_throughput)
    if m.goodput is not None:
        kv("Request goodput (req/s):", m.goodput)
    kv("Output token throughput (tok/s):", m.output_throughput)
    kv("Total Token throughput (tok/s):", m.total_token_throughput)
    for name, header in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                         ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        if name not in latencies:
            continue
        d: Distribution = getattr(m, name)
        lines.append(f"{header:-^60}")
        kv(f"Mean {name.upper()} (ms):", d.mean * 1e3)
        kv(f"Median {name.upper()} (ms):", d.median * 1e3)
        wanted = set(d.percentiles) - {50.0} if shown is None else set(shown)  # (the median printed above)
        for p, v in d.percentiles.items():
            if p in wanted:
                kv(f"P{p:g} {name.upper()} (ms):", v * 1e3)
    if m.intake is not None:
        lines.append(f"{'TTFT by stage (median / P99)':-^60}")
        for name, label in (("intake", "Intake, arrival to taken in"), ("queue", "Queue, to first pass"),
                            ("prefill", "Prefill, to first token")):
            d = getattr(m, name)
            kv(f"{label} (ms):", f"{d.median * 1e3:.2f} / {d.percentiles.get(99.0, math.nan) * 1e3:.2f}", "{}")
    lines.append("=" * 60)
    return "\n".join(lines)


# ---------------------------------------------------------------- replications and checks


def confidence_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the Student-t confidence interval of independent replications'
    values (half-width nan with fewer than two)."""
    a = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if a.size == 0:
        return float("nan"), float("nan")
    if a.size < 2:
        return float(a.mean()), float("nan")
    from scipy import stats
    half = stats.t.ppf((1 + level) / 2, a.size - 1) * a.std(ddof=1) / math.sqrt(a.size)
    return float(a.mean()), float(half)


def summarize_replications(rows: Sequence[dict], keys: Iterable[str] | None = None,
                           level: float = 0.95) -> dict[str, tuple[float, float]]:
    """Per metric (`keys`, default every numeric column of `Metrics.as_row()` rows) of
    independent replications: (mean, confidence-interval half-width)."""
    if keys is None:
        keys = [k for k, v in rows[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return {k: confidence_interval([r[k] for r in rows if r.get(k) is not None], level) for k in keys}


def format_replications(summary: dict[str, tuple[float, float]], n: int, level: float = 0.95,
                        keys: Iterable[str] = ("request_throughput", "output_throughput", "request_goodput",
                                               "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms",
                                               "mean_e2el_ms")) -> str:
    """A table of means with their confidence intervals over `n` replications."""
    lines = [f"{f' {n} replications, mean +- {level:.0%} CI ':=^60}"]
    for k in keys:
        if k in summary and not math.isnan(summary[k][0]):
            mean, half = summary[k]
            lines.append(f"{k:<40}{mean:<10.2f} +- {half:.2f}")
    lines.append("=" * 60)
    return "\n".join(lines)


def littles_law(records: Iterable[RequestRecord]) -> tuple[float, float, float]:
    """(L, lambda, W) over the completed requests: L the time-average number in the system,
    measured by sweeping arrivals and departures; lambda = n / span; W the mean time in the
    system. L = lambda * W on any consistent run."""
    done = [r for r in records if r.completed]
    if not done:
        return 0.0, 0.0, 0.0
    events = sorted([(r.arrival_s, 1) for r in done] + [(r.finish_s, -1) for r in done])
    area, count, last = 0.0, 0, events[0][0]
    for t, step in events:
        area += count * (t - last)
        count, last = count + step, t
    span = events[-1][0] - events[0][0]
    if span <= 0:
        return 0.0, 0.0, 0.0
    return area / span, len(done) / span, sum(r.finish_s - r.arrival_s for r in done) / len(done)
