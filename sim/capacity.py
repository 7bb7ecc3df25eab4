"""Capacity search: the highest arrival rate, or the fewest replicas, that meets latency SLOs.

An SLO is NAME:STAT:MS, e.g. `ttft:p99:200` (NAME one of ttft, tpot, itl, e2el; STAT one of
mean, p50, p90, p99). Each search bisects one axis: `rate` (Poisson arrivals at that many
req/s, the trace's lengths), `rate-scale` (the trace's own arrivals, that many times faster) or
`replicas` (at the load the other options give). A probe runs `replications` seeds (seed,
seed+1, ...: the same seeds at every probe, so probes differ only by the searched value) and
meets the SLOs when, for every SLO, the mean over those runs of its metric is within its limit;
each metric's mean comes with its confidence interval. The search doubles (or halves) from
`start` until one probe meets and one fails, then bisects: rates until the gap between them is
within `tolerance` of the one that meets, replicas until they are one apart.

Runs are finite: past saturation a queue grows through the run, so how far past the limit an
overloaded probe lands depends on the trace's length (not whether it fails).

One search per point of the grid of the other axes (e.g. one per `--policy`); the searches run
side by side, each round's probes together on one runner (`sim.fanout`: local processes or
Modal).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from core.metrics import summarize_replications
from sim.build import AXES, RunSpec

METRICS = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "p50", "p90", "p99")  # what core.metrics.compute_metrics reports
SEARCHES = {"rate": "rate", "rate-scale": "rate_scale", "replicas": "replicas"}  # --search -> RunSpec field
MAX_STEPS = 12  # doublings or halvings from the start before a search gives up (a factor of 4096)


@dataclass(frozen=True)
class SLO:
    metric: str
    stat: str
    limit_ms: float

    @property
    def column(self) -> str:
        """Its metric's column in a run's row (core.metrics.Metrics.as_row)."""
        return f"{self.stat}_{self.metric}_ms"

    def __str__(self) -> str:
        return f"{self.stat} {self.metric} <= {self.limit_ms:g} ms"


def parse_slos(specs: Iterable[str]) -> list[SLO]:
    """`["ttft:p99:200", "tpot:p99:20"]` -> SLOs; a bad one is a one-line ValueError naming it."""
    slos = []
    for spec in specs:
        parts = spec.split(":")
        if len(parts) != 3:
            raise ValueError(f"--slo {spec!r}: expected NAME:STAT:MS, e.g. ttft:p99:200")
        metric, stat, ms = parts
        if metric not in METRICS:
            raise ValueError(f"--slo {spec!r}: unknown metric {metric!r}; choose from {', '.join(METRICS)}")
        if stat not in STATS:
            raise ValueError(f"--slo {spec!r}: unknown statistic {stat!r}; choose from {', '.join(STATS)}")
        try:
            limit = float(ms)
        except ValueError:
            raise ValueError(f"--slo {spec!r}: {ms!r} is not a number of milliseconds") from None
        if not (math.isfinite(limit) and limit > 0):
            raise ValueError(f"--slo {spec!r}: the limit must be a positive number of milliseconds")
        if any(s.column == f"{stat}_{metric}_ms" for s in slos):
            raise ValueError(f"--slo {spec!r}: {stat} {metric} is given twice")
        slos.append(SLO(metric, stat, limit))
    if not slos:
        raise ValueError("--slo: give at least one SLO, e.g. --slo ttft:p99:200 tpot:p99:20")
    return slos


@dataclass
class Bisection:
    """A monotone search on one axis. Rates (`fewest` False): the highest value that meets, with
    every lower one meeting; replicas (`fewest` True, integers): the smallest, every higher one
    meeting. `good` is the best value seen to meet, `bad` the nearest seen to fail. Halving
    stops at `floor` (rates: the lowest whose arrivals stay within what a trace may span), or
    when `exhausted` (lower rates serve every request as before: no load to take away)."""

    start: float
    fewest: bool = False
    tolerance: float = 0.02
    floor: float = 0.0
    good: float | None = None
    bad: float | None = None
    exhausted: bool = False

    def next_value(self) -> float | None:
        """The next value to probe; None when the search is over."""
        reach = 2 ** MAX_STEPS
        if self.exhausted:
            return None
        if self.fewest:
            if self.good is None:  # nothing met yet: double
                if self.bad is None:
                    return int(self.start)
                return None if self.bad >= self.start * reach else int(self.bad * 2)
            if self.bad is None:  # everything met so far: halve, down to 1
                return None if self.good <= 1 else max(1, int(self.good) // 2)
            return None if self.good - self.bad <= 1 else (int(self.good) + int(self.bad)) // 2
        if self.bad is None:
            if self.good is None:
                return self.start
            return None if self.good >= self.start * reach else self.good * 2
        if self.good is None:
            return None if self.bad <= self.start / reach or self.bad / 2 < self.floor else self.bad / 2
        return None if self.bad - self.good <= self.tolerance * self.good else (self.good + self.bad) / 2

    def record(self, value: float, meets: bool) -> None:
        if meets:
            self.good = value
        else:
            self.bad = value

    def probes_left(self) -> int | None:
        """About how many probes remain (None while still looking for a bracket)."""
        if self.good is None or self.bad is None:
            return None
        if self.fewest:
            return max(0, math.ceil(math.log2(max(1, self.good - self.bad))))
        return max(0, math.ceil(math.log2((self.bad - self.good) / (self.tolerance * self.good))))


@dataclass
class Probe:
    value: float
    rows: list[dict]
    stats: dict[str, tuple[float, float]]  # column -> (mean, CI half-width) over the replications
    meets: bool


@dataclass
class Search:
    point: RunSpec  # the grid point: everything but the searched value
    bisection: Bisection
    probes: list[Probe] = field(default_factory=list)

    def probe_at(self, value: float | None) -> Probe | None:
        return next((p for p in self.probes if p.value == value), None)


SHOWN = ("request_throughput",)  # reported at the answer beside the SLO metrics


def judge(value: float, rows: list[dict], slos: list[SLO], level: float = 0.95) -> Probe:
    """A probe's verdict: every SLO metric's mean over the replications within its limit (a
    metric no request defines, nan, does not meet)."""
    columns = [s.column for s in slos] + [c for c in (*SHOWN, "request_goodput") if rows[0].get(c) is not None]
    stats = summarize_replications(rows, columns, level)
    meets = all(stats[s.column][0] <= s.limit_ms for s in slos)  # nan compares False
    return Probe(value, rows, stats, meets)


def _key(values: dict | RunSpec) -> tuple:
    get = values.get if isinstance(values, dict) else (lambda k: getattr(values, k))
    return tuple(get(k) for k in (*AXES, "seed"))


def search(points: list[RunSpec], searched: str, slos: list[SLO], run: Callable, *, start: float,
           replications: int = 1, tolerance: float = 0.02, floor: float = 0.0,
           goodput: dict[str, float] | None = None,
           on_probe: Callable[[list[Search]], None] | None = None) -> list[Search]:
    """One bisection of `searched` (a RunSpec field: rate, rate_scale, replicas) per grid point.
    Each round takes every unfinished search's next probe, runs its replications on `run` (a
    sim.fanout runner) and records the verdicts; `on_probe(searches)` after each probe. A
    search that has met nothing stops halving once a probe's SLO metrics equal the previous
    probe's: the requests no longer meet in the queue, so less load cannot help."""
    fewest = searched == "replicas"
    searches = [Search(p, Bisection(start, fewest, tolerance, floor)) for p in points]
    while True:
        wanted: dict[tuple, tuple[Search, float]] = {}
        specs = []
        for s in searches:
            value = s.bisection.next_value()
            if value is None:
                continue
            for i in range(replications):
                spec = s.point.with_(**{searched: value}, seed=s.point.seed + i)
                wanted[_key(spec)] = (s, value)
                specs.append(spec)
        if not specs:
            return searches
        got: dict[int, list[dict]] = {}
        for row in run(specs, goodput):
            s, value = wanted[_key(row)]
            rows = got.setdefault(id(s), [])
            rows.append(row)
            if len(rows) == replications:
                probe = judge(value, sorted(rows, key=lambda r: r["seed"]), slos)
                last = s.probes[-1] if s.probes else None
                s.probes.append(probe)
                s.bisection.record(value, probe.meets)
                if (not fewest and not probe.meets and s.bisection.good is None and last is not None
                        and all(math.isclose(probe.stats[x.column][0], last.stats[x.column][0], rel_tol=1e-9)
                                for x in slos)):
                    s.bisection.exhausted = True
                if on_probe is not None:
                    on_probe(searches)


def answer_column(searched: str) -> str:
    return "min_replicas" if searched == "replicas" else f"max_{searched}"


def table(searches: list[Search], searched: str, varying: Iterable[str], slos: list[SLO]) -> list[dict]:
    """One row per search: the grid point's varying axes, the answer (nan when no probe met),
    `fails_at` (the nearest probe that failed: past the answer by at most the tolerance, or the
    replica count just below), each SLO metric and the request throughput at the answer with
    their CI half-widths (`_ci`), and the probes and runs it took."""
    out = []
    for s in searches:
        row = {a: getattr(s.point, a) for a in varying}
        b = s.bisection
        row[answer_column(searched)] = math.nan if b.good is None else b.good
        row["fails_at"] = math.nan if b.bad is None else b.bad
        at = s.probe_at(b.good)
        for column in [x.column for x in slos] + [c for c in (*SHOWN, "request_goodput")
                                                   if s.probes and c in s.probes[0].stats]:
            mean, half = at.stats[column] if at is not None else (math.nan, math.nan)
            row[column], row[f"{column}_ci"] = mean, half
        row["probes"] = len(s.probes)
        row["runs"] = sum(len(p.rows) for p in s.probes)
        out.append(row)
    return out


def probe_rows(searches: list[Search], searched: str, varying: Iterable[str]) -> list[dict]:
    """Every probe of every search, in order: the grid point, the value, the verdict, the means
    and CI half-widths of the metrics judged."""
    out = []
    for s in searches:
        for p in s.probes:
            row = {a: getattr(s.point, a) for a in varying}
            row[searched] = p.value
            row["meets"] = p.meets
            row["replications"] = len(p.rows)
            for column, (mean, half) in p.stats.items():
                row[column], row[f"{column}_ci"] = mean, half
            out.append(row)
    return out


def lowest_rate(searched: str, trace) -> float:
    """The lowest rate (or rate scale) whose arrivals stay within the span a trace may have."""
    from traces.trace import MAX_ARRIVAL_S

    if searched == "rate":
        return 2 * len(trace) / MAX_ARRIVAL_S  # n Poisson arrivals span about n / rate
    if searched == "rate_scale":
        return trace.span_s / MAX_ARRIVAL_S
    return 0.0


def default_start(searched: str, trace) -> float:
    """The first probe: the trace's own mean rate (rate), its own times (rate_scale 1), one replica."""
    if searched == "rate":
        return len(trace) / trace.span_s if trace.span_s > 0 else 1.0
    return 1


def probe_points(base: RunSpec, axes: dict[str, list], searched: str, given: dict, start: float | None,
                 slos: list[SLO], tolerance: float) -> tuple[list[RunSpec], float, float]:
    """The grid points to search (every combination of the other axes' values, the searched one
    set to the first probe), that first probe and the lowest value worth probing; a bad
    combination is a one-line ValueError."""
    from sim.build import load_trace_file
    from sim.sweep import grid

    flag = "--" + searched.replace("_", "-")
    if searched in given:
        raise ValueError(f"{flag}: --search {flag[2:]} varies it; give the first probe with --start")
    clash = {"rate": "rate_scale", "rate_scale": "rate"}.get(searched)
    if clash in given:
        raise ValueError(f"--{clash.replace('_', '-')}: not with --search {flag[2:]} (Poisson arrivals at a rate "
                         f"replace the trace's own times)")
    if searched == "replicas" and base.disaggregate is not None:
        raise ValueError("--search replicas: not with --disaggregate (search the rate instead)")
    if not 0 < tolerance < 1:
        raise ValueError(f"--tolerance must be between 0 and 1, got {tolerance}")
    trace = load_trace_file(base.trace, base.trace_format)  # a bad trace fails here, before any work
    trace = trace.take(np.arange(min(len(trace), base.limit or len(trace))))
    if start is None:
        start = default_start(searched, trace)
    if not (math.isfinite(start) and start > 0):
        raise ValueError(f"--start must be a positive number, got {start}")
    if searched == "replicas":
        if start != int(start):
            raise ValueError(f"--start {start}: a number of replicas")
        start = int(start)
    else:
        start = float(start)
    if any(s.metric == "itl" and s.stat != "mean" for s in slos):
        base = base.with_(keep_token_times=True)  # ITL percentiles need every token's time
    others = {k: v for k, v in axes.items() if k != searched}
    return grid(base.with_(**{searched: start}), 1, **others), start, lowest_rate(searched, trace)


def report(searches: list[Search], searched: str, axes: dict[str, list], slos: list[SLO], replications: int,
           tolerance: float, out=None) -> list[dict]:
    """Print the table and, with `out`, write capacity.csv and probes.csv; returns the table."""
    varying = [k for k, v in axes.items() if len(v) > 1 and k != searched]
    rows = table(searches, searched, varying, slos)
    unused = {searched, "rate_scale" if searched == "rate" else searched}  # rate: the trace's times are not used
    fixed = ", ".join(f"{k}={v[0]}" for k, v in axes.items() if len(v) == 1 and k not in unused)
    print_table(rows, searched, slos, replications, tolerance, fixed)
    for line in notes(searches, searched, varying, slos):
        print(line)
    if out is not None:
        write_tables(out, rows, probe_rows(searches, searched, varying))
    return rows


def run_searches(points: list[RunSpec], searched: str, slos: list[SLO], run: Callable, *, start: float,
                 replications: int, tolerance: float, floor: float = 0.0, goodput: dict[str, float] | None = None,
                 progress: bool = True) -> list[Search]:
    """`search` with a progress bar of probes done (its total an estimate once every search has
    found its bracket)."""
    from tqdm import tqdm

    with tqdm(desc="capacity", unit="probe", disable=not progress) as bar:
        def on_probe(searches: list[Search]) -> None:
            left = [s.bisection.probes_left() for s in searches]
            done = sum(len(s.probes) for s in searches)
            if all(n is not None for n in left):
                bar.total = done + sum(left)
            bar.update(done - bar.n)

        return search(points, searched, slos, run, start=start, replications=replications,
                      tolerance=tolerance, floor=floor, goodput=goodput, on_probe=on_probe)


def print_table(rows: list[dict], searched: str, slos: list[SLO], replications: int, tolerance: float,
                fixed: str) -> None:
    """The searches' table (CI columns only where there are several replications)."""
    import pandas as pd

    what = "fewest replicas" if searched == "replicas" else f"highest {searched}"
    precision = "" if searched == "replicas" else f", to within {tolerance:.0%}"
    print(f"{what} meeting {', '.join(map(str, slos))} (mean of {replications} "
          f"replication{'s' if replications > 1 else ''} per probe{precision}); {fixed}")
    frame = pd.DataFrame(rows)
    frame = frame.drop(columns=[c for c in frame if c.endswith("_ci") and frame[c].isna().all()])
    value = lambda v: "-" if math.isnan(v) else f"{v:.4g}"  # noqa: E731 (rates span decades)
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.float_format", "{:.2f}".format):
        print(frame.to_string(index=False, formatters={answer_column(searched): value, "fails_at": value}))


def notes(searches: list[Search], searched: str, varying: Iterable[str], slos: list[SLO]) -> list[str]:
    """A line for each search that found no bracket: what its last probe measured."""
    lines = []
    for s in searches:
        name = ", ".join(f"{a}={getattr(s.point, a)}" for a in varying) or "the search"
        b, last = s.bisection, s.probes[-1] if s.probes else None
        if last is None or (b.good is not None and b.bad is not None):
            continue
        measured = ", ".join(f"{x.stat} {x.metric} {last.stats[x.column][0]:.4g} ms" for x in slos)
        if b.good is None:
            why = ("less load changed nothing, so requests served alone miss them" if b.exhausted
                   else "the search went no lower")
            lines.append(f"{name}: no probe met the SLOs; the last, {searched} {last.value:.4g}, measured "
                         f"{measured} ({why})")
        else:
            lines.append(f"{name}: every probe met the SLOs, up to {searched} {last.value:.4g} ({measured})")
    return lines


def write_tables(out, rows: list[dict], probes: list[dict]) -> None:
    """capacity.csv (the table) and probes.csv (every probe) under `out`, all or nothing."""
    import pandas as pd

    from sim.output import atomic_dir

    with atomic_dir(out) as tmp:
        pd.DataFrame(rows).to_csv(tmp / "capacity.csv", index=False)
        pd.DataFrame(probes).to_csv(tmp / "probes.csv", index=False)
    print(f"written {out / 'capacity.csv'} and {out / 'probes.csv'}")
