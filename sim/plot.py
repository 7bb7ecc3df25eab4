"""`python -m sim plot`: charts of runs and sweeps, as HTML and PNG (altair, rendered by vl-convert).

    python -m sim plot RUN_DIR [RUN_DIR ...] --out CHARTS
    python -m sim plot SWEEP_DIR --out CHARTS [--slo ttft:200 tpot:20]

A RUN_DIR is what `python -m sim run --out DIR` wrote (requests.jsonl, metrics.json, passes.jsonl
when the pass log was kept; rep0/, rep1/, ... with --replications), or one engine run's
directory under results/<engine>/<run_id>. A SWEEP_DIR is what `python -m sim sweep --out DIR`
wrote (runs.csv). Charts, each as NAME.html and NAME.png under --out:

- latency-cdf: the CDFs of TTFT, TPOT and E2EL, one line per run, each point a request's own
  value from its record, with the run's p99 from `core.metrics.compute_metrics` as a dashed rule;
- over-time (runs with a pass log): batch size and the KV blocks the pass's sequences hold, per
  pass (the mean per time interval on long runs), and the requests in the system;
- sweep: request throughput (and goodput), p99 TTFT, TPOT and E2EL against the arrival rate
  (or rate scale), the mean over replications with its 95% confidence band (`sim.sweep.summarize`,
  the function summary.csv comes from), the SLOs given with --slo as rules.

Every figure is read from the records or the rows `compute_metrics` made; nothing is recomputed
another way. The charts are written into a temporary directory and moved into place when all
are done, so a failure leaves no partial output.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from core.metrics import compute_metrics, parse_goodput
from core.records import PassRecord, RequestRecord, read_pass_records
from core.runstore import RunStore
from sim.html import chart_page
from sim.output import read_requests

MAX_CDF_POINTS = 2000   # per curve; a longer run is drawn at this many evenly spaced ranks
MAX_PASS_POINTS = 2000  # per run and replica; a longer pass log is drawn as the mean per interval
TIME_BINS = 1000
LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2EL"))


@dataclass
class Run:
    """One run's records and what the charts need to say about it."""

    label: str
    source: Path
    requests: list[RequestRecord]
    passes: list[PassRecord] = field(default_factory=list)
    block_size: int | None = None
    kv_blocks: int | None = None


# ---------------------------------------------------------------- reading the directories

RECORD_FILES = ("jsonl", "parquet", "csv")  # what `sim run --format` may write


def kind_of(path: Path) -> str:
    """"run", "runs" (replications), "sweep" or "engine" for a directory this command reads;
    a ValueError naming the directory for anything else."""
    if not path.exists():
        raise ValueError(f"{path}: no such directory")
    if not path.is_dir():
        raise ValueError(f"{path}: not a directory (give the directory written with --out)")
    if not any(path.iterdir()):
        raise ValueError(f"{path}: empty directory, nothing to plot")
    if any((path / f"requests.{ext}").exists() for ext in RECORD_FILES):
        return "run"
    if any(any(path.glob(f"rep*/requests.{ext}")) for ext in RECORD_FILES):
        return "runs"
    if (path / "runs.jsonl").exists():
        raise ValueError(f"{path}: an engine's results directory; give one run's directory under it, "
                         f"e.g. {path / '<run_id>'}")
    if (path / "runs.csv").exists():
        return "sweep"
    if (path / "requests.jsonl.gz").exists() and (path.parent / "runs.jsonl").exists():
        return "engine"
    raise ValueError(f"{path}: not a run or sweep directory (no requests.jsonl, .parquet or .csv, no runs.csv, "
                     f"no requests.jsonl.gz beside an engine's runs.jsonl)")


def _run_requests(path: Path) -> list[RequestRecord]:
    """A `sim run --out` directory's request records, in whichever --format it wrote them."""
    try:
        records = read_requests(path).records()
    except TypeError as e:
        raise ValueError(f"{path}: not request records ({e})") from None
    if not records:
        raise ValueError(f"{path}: no request records")
    return records


def _passes(path: Path) -> list[PassRecord]:
    if not path.exists():
        return []
    try:
        return read_pass_records(path)
    except TypeError as e:
        raise ValueError(f"{path}: not pass records ({e})") from None


def read_sim_run(path: Path) -> Run:
    """A directory `sim run --out` wrote (or one of its rep*/ directories)."""
    spec = {}
    if (path / "metrics.json").exists():
        try:
            spec = json.loads((path / "metrics.json").read_text()).get("spec", {})
        except (json.JSONDecodeError, AttributeError) as e:
            raise ValueError(f"{path / 'metrics.json'}: not the metrics.json sim run writes ({e})") from None
    label = spec.get("policy", path.name)
    if (spec.get("replicas") or 1) > 1:
        label += f", {spec['replicas']} replicas"
    if spec.get("disaggregate"):
        label += f", disaggregated {spec['disaggregate']}"
    if path.name.startswith("rep"):
        label += f", seed {spec.get('seed', path.name)}"
    return Run(label, path, _run_requests(path), _passes(path / "passes.jsonl"),
               spec.get("block_size"), spec.get("kv_blocks"))


def read_engine_run(path: Path) -> Run:
    """One engine run's directory, results/<engine>/<run_id>, through its RunStore."""
    store = RunStore(path.parent)
    row = next((r for r in store.rows() if r.get("run_id") == path.name), {})
    requests = store.requests(path.name)
    if not requests:
        raise ValueError(f"{path}: no request records")
    try:
        passes = store.passes(path.name)
    except FileNotFoundError:
        passes = []
    kv = row.get("kv_blocks")
    return Run(path.name, path, requests, passes, row.get("block_size"), min(kv) if isinstance(kv, list) else kv)


def read_runs(paths: list[Path]) -> tuple[list[Run], Path | None]:
    """The runs in `paths` and the sweep directory among them (at most one)."""
    runs, sweeps = [], []
    for path in paths:
        kind = kind_of(path)
        if kind == "run":
            runs.append(read_sim_run(path))
        elif kind == "runs":
            runs += [read_sim_run(p.parent) for p in sorted(path.glob("rep*/requests.jsonl"))]
        elif kind == "engine":
            runs.append(read_engine_run(path))
        else:
            sweeps.append(path)
    if len(sweeps) > 1:
        raise ValueError(f"{sweeps[1]}: give one sweep directory at a time ({sweeps[0]} is one already)")
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.label] = seen.get(run.label, 0) + 1
    for run in runs:
        if seen[run.label] > 1:
            run.label = f"{run.label} ({run.source})"
    for run in runs:
        if not any(r.completed for r in run.requests):
            raise ValueError(f"{run.source}: no request completed, no latency to plot")
    return runs, (sweeps[0] if sweeps else None)


def read_sweep(path: Path) -> list[dict]:
    """runs.csv's rows, read back as the sweep reads them to resume."""
    from sim.build import AXES
    from sim.sweep import _read_done

    rows = _read_done(path / "runs.csv")
    if not rows:
        raise ValueError(f"{path / 'runs.csv'}: no runs")
    missing = [c for c in (*AXES, "seed", "request_throughput", "p99_ttft_ms") if c not in rows[0]]
    if missing:
        raise ValueError(f"{path / 'runs.csv'}: not a sweep's runs.csv (no column {missing[0]})")
    return rows


# ---------------------------------------------------------------- what is drawn


def latency_values(records: list[RequestRecord], metric: str) -> np.ndarray:
    """Every completed request's TTFT, TPOT or E2EL (seconds), sorted: the samples
    compute_metrics takes its percentiles of."""
    done = [r for r in records if r.completed]
    values = [getattr(r, f"{metric}_s") for r in done]
    return np.sort(np.array([v for v in values if v is not None], dtype=float))


def cdf_frame(runs: list[Run]):
    """run, metric, ms, fraction: the empirical CDF's points (a request's value and the share of
    requests at or below it), and the p99 of each from compute_metrics."""
    import pandas as pd

    points, p99 = [], []
    for run in runs:
        metrics = compute_metrics(run.requests)
        for metric, name in LATENCIES:
            v = latency_values(run.requests, metric)
            if not len(v):
                continue
            ranks = np.arange(len(v))
            if len(v) > MAX_CDF_POINTS:
                ranks = np.unique(np.round(np.linspace(0, len(v) - 1, MAX_CDF_POINTS)).astype(int))
            points.append(pd.DataFrame({"run": run.label, "metric": name, "ms": v[ranks] * 1e3,
                                        "fraction": (ranks + 1) / len(v)}))
            p99.append({"run": run.label, "metric": name, "ms": getattr(metrics, metric).percentiles[99.0] * 1e3})
    return pd.concat(points, ignore_index=True), pd.DataFrame(p99)


def kv_blocks_held(p: PassRecord, block_size: int) -> int:
    """Blocks the pass's sequences hold once it has run: each sequence's context plus its new
    tokens, in whole blocks (a prefix block shared by several sequences counts for each)."""
    return sum(-(-(c + n) // block_size) for c, n in zip(p.context_lens, p.new_tokens))


def steps(start: np.ndarray, end: np.ndarray, value: np.ndarray, gap: float):
    """A step line's points: each interval's (start, value), and (end, value) closing each run of
    intervals that follow one another within `gap`; `segment` numbers those runs, so that the line
    breaks where nothing ran."""
    new = np.r_[True, start[1:] > end[:-1] + gap]
    segment = np.cumsum(new)
    closes = np.r_[new[1:], True]
    return np.r_[start, end[closes]], np.r_[value, value[closes]], np.r_[segment, segment[closes]]


def over_time_frame(runs: list[Run]):
    """run, series, time_s, value, segment: the batch size and the KV blocks held of each pass,
    from its start to its end, per replica (past MAX_PASS_POINTS passes, the mean of the passes
    started in each of TIME_BINS intervals, over the interval), the line broken where the replica
    idled; and the requests in the system (arrived, not finished) at each arrival and finish (past
    MAX_PASS_POINTS of those, at TIME_BINS + 1 evenly spaced times)."""
    import pandas as pd

    from sim.compare import in_system

    frames = []
    for run in runs:
        if not run.passes:
            continue
        replicas = sorted({p.replica for p in run.passes})
        end = max(max(r.finish_s or r.arrival_s for r in run.requests), max(p.start_s + p.duration_s for p in run.passes))
        gap = end / 2000  # a third of a pixel at the chart's width: idle time shorter than that is not drawn
        for replica in replicas:
            mine = [p for p in run.passes if p.replica == replica]
            name = run.label + (f", replica {replica}" if len(replicas) > 1 else "")
            t = np.array([p.start_s for p in mine])
            t_end = t + np.array([p.duration_s for p in mine])
            series = {"batch size": np.array([p.batch_size for p in mine], float)}
            if run.block_size:
                series["KV blocks held"] = np.array([kv_blocks_held(p, run.block_size) for p in mine], float)
            if len(mine) > MAX_PASS_POINTS:
                edges = np.linspace(0.0, end, TIME_BINS + 1)
                idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, TIME_BINS - 1)
                used = np.unique(idx)
                counts = np.bincount(idx, minlength=TIME_BINS)[used]
                series = {k: np.bincount(idx, v, minlength=TIME_BINS)[used] / counts for k, v in series.items()}
                t, t_end = edges[used], edges[used + 1]
            for name_s, values in series.items():
                x, y, segment = steps(t, t_end, values, gap)
                frames.append(pd.DataFrame({"run": name, "series": name_s, "time_s": x, "value": y,
                                            "segment": segment}))
        events = np.unique([r.arrival_s for r in run.requests] + [r.finish_s for r in run.requests if r.finish_s])
        if len(events) > MAX_PASS_POINTS:
            events = np.linspace(0.0, end, TIME_BINS + 1)
        frames.append(pd.DataFrame({"run": run.label, "series": "requests in the system", "time_s": events,
                                    "value": in_system(run.requests, events).astype(float), "segment": 1}))
    return pd.concat(frames, ignore_index=True) if frames else None


SWEEP_PANELS = (("request_throughput", "request throughput (req/s)", None),
                ("request_goodput", "goodput (req/s)", None),
                ("p99_ttft_ms", "p99 TTFT (ms)", "ttft"),
                ("p99_tpot_ms", "p99 TPOT (ms)", "tpot"),
                ("p99_e2el_ms", "p99 E2EL (ms)", "e2el"))


def _show(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def sweep_frame(rows: list[dict], where: str = "the sweep"):
    """x, series, metric, mean, ci, lo, hi per grid point and panel: the replications' mean and
    95% confidence half-width from `sim.sweep.summarize`. Returns (frame, x axis name)."""
    import pandas as pd

    from sim.build import AXES
    from sim.sweep import summarize

    varies = [a for a in AXES if len({_show(r[a]) for r in rows}) > 1]
    x = "rate" if "rate" in varies else "rate_scale" if "rate_scale" in varies else None
    if x is None:
        raise ValueError(f"{where}: the sweep varies neither --rate nor --rate-scale, so there is no arrival rate "
                         f"to draw against")
    others = [a for a in varies if a != x]
    metrics = [m for m, _, _ in SWEEP_PANELS if any(isinstance(r.get(m), float) and not math.isnan(r[m]) for r in rows)]
    out = []
    for point in summarize(rows, metrics):
        label = ", ".join(_show(point[a]) if a == "policy" else f"{a}={_show(point[a])}" for a in others) or "all"
        for metric in metrics:
            mean, ci = point[metric], point[f"{metric}_ci"]
            out.append({"x": point[x], "series": label, "metric": metric, "mean": mean, "ci": ci,
                        "replications": point["replications"]})
    df = pd.DataFrame(out)
    df["lo"], df["hi"] = df["mean"] - df["ci"], df["mean"] + df["ci"]
    return df, x


# ---------------------------------------------------------------- the charts


def spread_scale(values):
    """A log scale for positive values spanning ten times or more, else a linear one not held to 0."""
    import altair as alt

    lo, hi = float(values.min()), float(values.max())
    return alt.Scale(type="log") if lo > 0 and hi / lo >= 10 else alt.Scale(zero=False)


def cdf_chart(runs: list[Run]):
    import altair as alt

    points, p99 = cdf_frame(runs)
    panels = []
    for _, name in LATENCIES:
        mine = points[points.metric == name]
        if mine.empty:
            continue
        line = alt.Chart(mine).mark_line(interpolate="step-after").encode(
            x=alt.X("ms:Q", scale=spread_scale(mine["ms"]), title=f"{name} (ms)"),
            y=alt.Y("fraction:Q", title="fraction of requests"), color=alt.Color("run:N", title=None))
        rule = alt.Chart(p99[p99.metric == name]).mark_rule(strokeDash=[4, 3]).encode(
            x="ms:Q", color=alt.Color("run:N", title=None), tooltip=["run", alt.Tooltip("ms:Q", format=".3f")])
        panels.append((line + rule).properties(width=260, height=200, title=f"{name} (dashed: p99)"))
    return alt.hconcat(*panels).properties(title="Latency CDFs, one point per request").configure_legend(
        labelLimit=500, symbolOpacity=1)


def over_time_chart(runs: list[Run]):
    import altair as alt

    df = over_time_frame(runs)
    if df is None:
        return None
    binned = any(len([p for p in r.passes if p.replica == k]) > MAX_PASS_POINTS
                 for r in runs for k in {p.replica for p in r.passes})
    capacity = sorted({r.kv_blocks for r in runs if r.passes and r.kv_blocks})
    titles = {"batch size": "sequences in the pass",
              "KV blocks held": "KV blocks the pass's sequences hold"
                                + (f" (cache: {', '.join(f'{c:,}' for c in capacity)} blocks)" if capacity else ""),
              "requests in the system": "requests in the system (arrived, not finished)"}
    charts = []
    for series, title in titles.items():
        mine = df[df.series == series]
        if mine.empty:
            continue
        charts.append(alt.Chart(mine).mark_line(interpolate="step-after").encode(
            x=alt.X("time_s:Q", title="time (s)"), y=alt.Y("value:Q", title=series),
            color=alt.Color("run:N", title=None), detail="segment:N").properties(width=640, height=150, title=title))
    note = (f"; past {MAX_PASS_POINTS:,} passes, the mean of the passes started in each 1/{TIME_BINS:,} of the run"
            if binned else "")
    return alt.vconcat(*charts).properties(title=f"Over time: each pass from its start to its end, a gap where "
                                                 f"nothing ran{note}").configure_legend(labelLimit=500, symbolOpacity=1)


def sweep_chart(rows: list[dict], slos: dict[str, float], name: str):
    import altair as alt
    import pandas as pd

    df, x = sweep_frame(rows, name)
    title_x = "arrival rate (req/s)" if x == "rate" else "rate scale (x the trace's own rate)"
    xs = df["x"].astype(float)
    xscale = spread_scale(xs)
    panels = []
    for metric, title, slo in SWEEP_PANELS:
        mine = df[df.metric == metric]
        if mine.empty:
            continue
        latency = metric.endswith("_ms")
        yscale = spread_scale(pd.concat([mine["mean"], mine["hi"].dropna()])) if latency else alt.Scale()
        if latency and yscale.type == "log":  # a band below zero has no place on a log scale
            mine = mine.assign(lo=mine["lo"].clip(lower=mine["mean"] / 10))
        enc = {"x": alt.X("x:Q", scale=xscale, title=title_x), "color": alt.Color("series:N", title=None)}
        line = alt.Chart(mine).mark_line(point=True).encode(
            y=alt.Y("mean:Q", scale=yscale, title=title), tooltip=["series", "x", "mean", "ci", "replications"], **enc)
        layers = [line]
        band = mine.dropna(subset=["ci"])
        if not band.empty:
            layers.insert(0, alt.Chart(band).mark_area(opacity=0.2).encode(y="lo:Q", y2="hi:Q", **enc))
        if slo and slo in slos:
            layers.append(alt.Chart(pd.DataFrame({"y": [slos[slo] * 1e3], "label": [f"SLO {slos[slo] * 1e3:g} ms"]}))
                          .mark_rule(color="red", strokeDash=[6, 3]).encode(y="y:Q", tooltip=["label"]))
        if metric == "request_throughput" and x == "rate":
            offered = pd.DataFrame({"x": sorted(set(xs))})
            layers.append(alt.Chart(offered).mark_line(color="gray", strokeDash=[2, 2]).encode(
                x=alt.X("x:Q", scale=xscale), y="x:Q"))
        panels.append(alt.layer(*layers).properties(width=260, height=200, title=title))
    reps = sorted(set(df["replications"]))
    what = (f"mean of {'/'.join(map(str, reps))} replications, 95% confidence band" if reps != [1]
            else "one run per point")
    lines = "; red dashed: SLO" if any(s in slos for *_, s in SWEEP_PANELS if s) else ""
    offered = "; gray dotted: the offered rate" if x == "rate" else ""
    return alt.concat(*panels, columns=3).properties(title=f"{name}: {what}{lines}{offered}").configure_legend(
        labelLimit=500, symbolOpacity=1)


# ---------------------------------------------------------------- the command


def add_plot_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR",
                   help="what sim run --out or sim sweep --out wrote, or results/<engine>/<run_id>")
    p.add_argument("--out", type=Path, required=True, help="directory for the charts (NAME.html, NAME.png)")
    p.add_argument("--slo", nargs="+", default=[], metavar="NAME:MS",
                   help="SLOs drawn on a sweep's latency panels: ttft:MS tpot:MS e2el:MS (as --goodput)")
    p.add_argument("--overwrite", action="store_true", help="replace what --out holds")


def cmd_plot(args: argparse.Namespace) -> int:
    from sim.output import atomic_dir, check_out_dir

    try:
        slos = parse_goodput(args.slo)
    except ValueError as e:
        raise ValueError(f"--slo: {e}") from None
    out = args.out.resolve()
    for d in args.dirs:
        if out == d.resolve() or out in d.resolve().parents:
            raise ValueError(f"--out {args.out}: would replace {d}, which it is to read; choose another directory")
    check_out_dir(args.out, args.overwrite)
    runs, sweep_dir = read_runs(args.dirs)
    charts = {}
    if runs:
        charts["latency-cdf"] = cdf_chart(runs)
        over = over_time_chart(runs)
        if over is not None:
            charts["over-time"] = over
        for run in runs:
            if not run.passes:
                print(f"{run.source}: no pass records, so no over-time chart for it (sim run --pass-log on keeps them)")
    if sweep_dir is not None:
        charts["sweep"] = sweep_chart(read_sweep(sweep_dir), slos, str(sweep_dir))
    with atomic_dir(args.out) as tmp:
        for name, chart in charts.items():
            (tmp / f"{name}.html").write_text(chart_page(chart, f"{name}: {', '.join(map(str, args.dirs))}"))
            chart.save(str(tmp / f"{name}.png"), ppi=96)
    print("written " + ", ".join(f"{args.out / name}.png" for name in charts) + " (and .html beside each)")
    return 0
