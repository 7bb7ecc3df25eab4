"""Command line: `python -m sim run` simulates one configuration, `python -m sim sweep` a grid.

    python -m sim run --trace FILE --policy continuous --cost roofline:h200 [--replicas 2] [--out DIR]
    python -m sim sweep --trace FILE --policy continuous,chunked --rate-scale 1,2 --rate 5,10 --replications 3

`run` prints a vLLM-style metrics table and, with --out, writes the request records
(requests.jsonl, requests.csv; or requests.parquet with --format parquet), the pass records
(passes.jsonl, passes.csv) when kept, and metrics.json; `metrics DIR` prints the table again from
them. `sweep` prints one summary line per grid point and writes runs.csv (a row per run,
as it finishes) and summary.csv (means with confidence intervals over replications) under --out.
Every option of a run is a field of `sim.build.RunSpec`, declared there once.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from core.atomic import write_text
from core.cli import ArgumentParser, check_writable_dir, goodput_slo, metric_percentiles, percentile_metrics
from core.jsontext import dumps
from core.metrics import (DEFAULT_PERCENTILES, LATENCIES, compute_metrics, format_metrics, format_rejections,
                          format_replications, left_out_json, parse_goodput, summarize_replications)
from core.records import records_to_csv, write_jsonl
from sim.build import (AXES, RunSpec, check_order, check_spec, check_trace, cli_fields, load_trace_file, option_flags,
                       simulate_spec, trace_left_out)
from sim.fanout import check_remote_cost
from sim.output import DEFAULT_FORMATS, FORMATS, atomic_dir, check_out_dir, parse_formats, read_left_out, \
    read_requests, write_requests
from sim.plot import add_plot_args, cmd_plot
from traces.download import DownloadError

REPO = Path(__file__).resolve().parent.parent
SMALL_TRACE = 5000  # "auto" keeps token times up to this many requests, pass records up to 2000


def listed(kind):
    """A parser for a comma-separated list of `kind` values (a sweep axis)."""
    def parse(text: str) -> list:
        try:
            return [kind(v) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__} values, got {text!r}") from None
    return parse


def add_run_args(p: argparse.ArgumentParser, sweep: bool) -> None:
    """One option per RunSpec field (sweep axes take comma-separated lists in a sweep), then the
    options about the output."""
    for f in cli_fields():
        meta = f.metadata
        flags = option_flags(f)
        text = meta["help"]
        if meta["type"] is bool:
            p.add_argument(*flags, dest=f.name, action="store_true", help=text)
            continue
        kind = meta["type"]
        if sweep and meta["axis"]:
            kind, text = listed(kind), text + " (comma-separated values sweep it)"
        if f.default is not None and not (sweep and meta["axis"]):
            text += f" (default {f.default})"
        choices = meta["choices"] if not (sweep and meta["axis"]) else None
        p.add_argument(*flags, dest=f.name, type=kind, default=f.default, choices=choices,
                       required=f.name == "trace", metavar=f.name.upper() if len(flags) > 1 else None, help=text)
    p.add_argument("--no-fast-forward", dest="fast_forward", action="store_false",
                   help="step every pass (slower): fast-forward gives the same results, to float rounding, "
                        "under every option (heat, host time, --overlap, --disaggregate, every router)")
    p.add_argument("--replications", type=int, default=1,
                   help="runs with seeds seed, seed+1, ... (only for runs that draw at random: --request-rate, power-of-two, --noise)")
    p.add_argument("--goodput", nargs="+", type=goodput_slo, default=[], metavar="NAME:MS",
                   help="SLOs for goodput, as vLLM: ttft:MS tpot:MS e2el:MS")
    if not sweep:
        add_percentiles_arg(p)
    p.add_argument("--out", type=Path, default=None, help="directory for records and metrics")
    p.add_argument("--overwrite", action="store_true", help="replace what --out holds")


def spec_from_args(args: argparse.Namespace, **axes) -> RunSpec:
    """The RunSpec the flags describe (`axes` override the flags a sweep varies)."""
    values = {f.name: getattr(args, f.name) for f in cli_fields()}
    values["fast_forward"] = args.fast_forward
    values.update(axes)
    return RunSpec(**values)


def check_replications(spec: RunSpec, replications: int) -> None:
    if replications < 1:
        raise ValueError(f"--replications must be at least 1, got {replications}")
    if replications > 1 and not spec.draws_at_random:
        raise ValueError("--replications: this run draws nothing at random (a trace replayed at its own "
                         "times, a deterministic router), so every replication would be the same; resample "
                         "the arrivals with --request-rate, or use --router power-of-two")


def add_percentiles_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metric-percentiles", type=metric_percentiles, default=None, metavar="P[,P...]",
                   help="the percentiles the table prints, as vLLM's flag (e.g. 25,50,75,99; default 90,99); "
                        "metrics.json keeps them beside p50, p90 and p99")
    p.add_argument("--percentile-metrics", type=percentile_metrics, default=LATENCIES, metavar="NAME[,NAME...]",
                   help="the latencies the table shows, as vLLM's flag: ttft, tpot, itl, e2el, comma-separated "
                        "(default all four; metrics.json keeps every one)")


def percentiles(chosen: tuple[float, ...] | None) -> tuple[float, ...]:
    """The percentiles to compute: the ones the table prints, beside those every row keeps (p50,
    p90, p99: what sweeps, capacity searches and plots read)."""
    return tuple(sorted(set(DEFAULT_PERCENTILES) | set(chosen or ())))


def cmd_run(args: argparse.Namespace) -> int:
    slos = parse_goodput(args.goodput)
    spec = spec_from_args(args)
    check_replications(spec, args.replications)
    formats = parse_formats(args.format)
    if args.out is not None:
        check_out_dir(args.out, args.overwrite)
    if args.save_result:
        check_writable_dir(args.result_dir, "--result-dir")
    spec, n = check_trace(spec)  # every row checked here, before any work; then the run streams it
    left_out = trace_left_out(spec)
    keep_times = {"auto": n <= SMALL_TRACE, "on": True, "off": False}[args.token_times]
    log_passes = {"auto": n <= 2000, "on": True, "off": False}[args.pass_log]
    p, d = spec.split_disaggregation()
    where = (f"{p} prefill + {d} decode replicas" if p else f"{spec.replicas} replica{'s' if spec.replicas > 1 else ''}")
    rows, results = [], []
    for i in range(args.replications):
        run = spec.with_(seed=spec.seed + i, keep_token_times=keep_times, log_passes=log_passes,
                         run_id=f"sim-{spec.policy}-s{spec.seed + i}")
        result = simulate_spec(run)
        metrics = compute_metrics(result.table, slos, percentiles(args.metric_percentiles))
        rows.append(metrics.as_row())
        results.append((run, result))
        if i == 0:
            print(format_metrics(metrics, f" {spec.policy}, {where}, {spec.cost} ", args.metric_percentiles,
                                 args.percentile_metrics, left_out))
            print(f"simulated {result.num_passes:,} passes to t={result.end_s:,.1f} s in {result.wall_s:.2f} s wall"
                  f"{'' if log_passes else ' (pass records off)'}")
            if spec.prefix_caching:
                print(f"prefix cache: {result.prefix_hit_tokens:,} prompt tokens hit "
                      f"({result.prefix_hit_tokens / max(1, metrics.total_input_tokens):.1%} of all prompt tokens)")
            if result.extrapolated:
                print(f"note: {result.extrapolated}", file=sys.stderr)
            if refused := format_rejections(result.table):
                print(refused, file=sys.stderr)
    if args.replications > 1:
        print(format_replications(summarize_replications(rows), args.replications))
    if args.save_result:
        save_result(args.result_dir, results[0][0], rows[0])
    if args.out is not None:
        with atomic_dir(args.out) as tmp:
            for i, ((run, result), row) in enumerate(zip(results, rows)):
                out = tmp if args.replications == 1 else tmp / f"rep{i}"
                write_run(out, run, result, row, formats, left_out)
        print(f"records written under {args.out}")
    return 0


def save_result(result_dir: Path, run: RunSpec, row: dict) -> Path:
    """`--save-result`: the run's metrics and choices as one JSON file named as vLLM names its
    (POLICY-RATEqps-MODEL-DATE.json; RATE "trace" for the trace's own arrivals)."""
    import datetime as dt
    now = dt.datetime.now()
    rate = f"{run.rate:g}" if run.rate is not None else "trace"
    path = result_dir / f"{run.policy}-{rate}qps-{run.model}-{now:%Y%m%d-%H%M%S}.json"
    result_dir.mkdir(parents=True, exist_ok=True)
    write_text(path, dumps({"date": f"{now:%Y%m%d-%H%M%S}", "model_id": run.model, "request_rate": run.rate,
                            "burstiness": run.burstiness, "num_prompts": row.get("completed", 0) + row.get("rejected", 0),
                            "spec": run.__dict__, **row}, indent=1, default=str))
    print(f"result saved to {path}")
    return path


def cmd_metrics(args: argparse.Namespace) -> int:
    """The metrics table of records a run wrote, in any of the formats `--format` writes."""
    slos = parse_goodput(args.goodput)
    records = read_requests(args.run)
    print(format_metrics(compute_metrics(records, slos, percentiles(args.metric_percentiles)), f" {args.run} ",
                         args.metric_percentiles, args.percentile_metrics, read_left_out(args.run)))
    if refused := format_rejections(records):
        print(refused, file=sys.stderr)
    return 0


def write_run(out: Path, run: RunSpec, result, row: dict, formats: list[str], left_out: dict | None = None) -> None:
    """A run's files: request records (requests.<format> for each of `formats`), pass records
    when kept (passes.jsonl, and passes.csv with the csv format), metrics.json (with the trace's
    rows its loader `left_out`, by reason: count and lines)."""
    write_requests(out, result.table, formats)
    if run.log_passes:
        write_jsonl(result.passes, out / "passes.jsonl")
        if "csv" in formats:
            records_to_csv(result.passes, out / "passes.csv")
    write_text(out / "metrics.json", dumps(
        {"spec": run.__dict__, "metrics": row, "left_out": left_out_json(left_out or {}), "passes": result.num_passes,
         "wall_s": result.wall_s},
        indent=1, default=str))


def cmd_sweep(args: argparse.Namespace) -> int:
    from sim.sweep import check_resume, grid, print_summary, sweep, sweep_record
    slos = parse_goodput(args.goodput)
    axes = {k: getattr(args, k) for k in AXES}
    axes = {k: (v if isinstance(v, list) else [v]) for k, v in axes.items() if v is not None}
    base = spec_from_args(args, **{k: v[0] for k, v in axes.items()})
    if args.mapper is not None:  # a cost file here is not in the mapper's containers
        for cost in axes.get("cost", [base.cost]):
            check_remote_cost(cost)
    specs = grid(base, args.replications, **axes)  # every point is checked here, before any work
    if args.replications < 1:
        raise ValueError(f"--replications must be at least 1, got {args.replications}")
    if args.replications > 1 and not any(s.draws_at_random for s in specs):
        check_replications(base, args.replications)
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    record = sweep_record(vars(args), axes, args.replications)
    if args.out is not None:
        check_out_dir(args.out, args.overwrite, args.resume)
        if args.resume:
            check_resume(args.out, record)
    if args.resume and args.out is None:
        raise ValueError("--resume: name the --out directory whose runs.csv to resume")
    trace = load_trace_file(base.trace, base.trace_format)  # a bad trace fails here, before the progress bar
    for point in {s.with_(seed=base.seed) for s in specs}:  # and a bad point (a KV cache too small...)
        check_spec(point)
        check_order(point, trace)
    rows, complete = sweep(specs, slos, jobs=args.jobs, out=args.out, resume=args.resume, mapper=args.mapper,
                            record=record)
    print_summary(rows, axes, slos, args.out)
    return 0 if complete else 130


def cmd_capacity(args: argparse.Namespace) -> int:
    from sim import capacity
    from sim.fanout import runner
    slos, goodput = capacity.parse_slos(args.slo), parse_goodput(args.goodput)
    searched = capacity.SEARCHES[args.search]
    given = {k: getattr(args, k) for k in AXES if isinstance(getattr(args, k), list)}  # the flags given
    axes = {k: (v if isinstance(v, list) else [v]) for k in AXES if (v := getattr(args, k)) is not None}
    base = spec_from_args(args, **{k: v[0] for k, v in axes.items()})
    points, start, floor = capacity.probe_points(base, axes, searched, given, args.start, slos, args.tolerance)
    check_replications(points[0], args.replications)
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    if args.mapper is not None:
        for cost in axes.get("cost", [base.cost]):
            check_remote_cost(cost)
    trace = load_trace_file(base.trace, base.trace_format)
    for point in points:  # a bad point (a KV cache too small...) fails here, as a sweep's does, before any probe
        check_spec(point)
        check_order(point, trace)
    if args.out is not None:
        check_out_dir(args.out, args.overwrite)
    with runner(args.jobs, args.mapper) as run:
        searches = capacity.run_searches(points, searched, slos, run, start=start, replications=args.replications,
                                         tolerance=args.tolerance, floor=floor, goodput=goodput)
    capacity.report(searches, searched, axes, slos, args.replications, args.tolerance, args.out)
    return 0


def report_dir(args: argparse.Namespace) -> Path:
    """Where `compare` writes: --out, else RESULTS/validation for the report the defaults make (the
    committed one), else out/validation: a subset of the runs (--only), another cost model, other
    seeds, another cost error or no cards' offsets never replace the committed report unless told
    to."""
    if args.out:
        return args.out
    from sim.compare import DEFAULT_REPEATS

    committed = ((args.only, args.cost, args.seeds, args.cost_error, args.card_offset,
                  tuple(getattr(args, "repeats", DEFAULT_REPEATS)))
                 == (None, "calibrated:h200", 5, 0.02, True, DEFAULT_REPEATS))
    return args.results / "validation" if committed else REPO / "out" / "validation"


def progress_of(bar):
    """A `progress(done, total)` callback that moves a tqdm bar."""
    def progress(i, n):
        bar.total = n
        bar.update(i - bar.n)
    return progress


def cmd_compare(args: argparse.Namespace) -> int:
    import tempfile

    import pandas as pd
    from tqdm import tqdm

    from sim.compare import (card_offsets, charts, error_rows, measured_rows, report_page, run_compare, select_runs,
                             targets, with_card_offsets)

    out = report_dir(args)
    if args.seeds < 0:
        raise ValueError(f"--seeds must be 0 or more, got {args.seeds}")
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    if not 0 <= args.cost_error < 1:
        raise ValueError(f"--cost-error must be from 0 to below 1 (0.02: every pass 2% shorter and longer), "
                         f"got {args.cost_error}")
    select_runs(args.results, only=args.only)  # none to compare: the error before the progress bar
    jobs = args.jobs or os.cpu_count() or 1
    with tqdm(desc="compare", unit="run", file=sys.stderr) as bar:
        comparisons = run_compare(args.results, args.cost, only=args.only, progress=progress_of(bar),
                                  seeds=args.seeds, cost_error=args.cost_error, jobs=jobs)
    repeats = tuple(args.repeats)
    measured = measured_rows(args.results, repeats)
    checks = targets(comparisons, measured)
    offsets = card_offsets(args.results, args.cost, repeats) if args.card_offset else {}
    if offsets:
        with tqdm(desc="compare with the cards' offsets", unit="run", file=sys.stderr) as bar:
            carded = run_compare(args.results, args.cost, only=args.only, progress=progress_of(bar), seeds=args.seeds,
                                 jobs=jobs, offsets={k: v[0] for k, v in offsets.items()})
        checks = with_card_offsets(checks, targets(carded, measured), offsets)
    out.mkdir(parents=True, exist_ok=True)
    errors = pd.DataFrame(error_rows(comparisons))
    errors.to_csv(out / "errors.csv", index=False)
    table = pd.DataFrame(checks)
    table[[c for c in table if not c.startswith("card_")] + [c for c in table if c.startswith("card_")]].to_csv(
        out / "targets.csv", index=False)  # the card offsets' columns last
    show = errors[errors.metric.isin(["ttft", "tpot", "e2el"]) & errors.stat.isin(["p50", "p90", "p99"])]
    wide = show.pivot_table(index="run_id", columns=["metric", "stat"], values="error", sort=False)
    with pd.option_context("display.width", 220, "display.max_columns", 20, "display.float_format", "{:+.1%}".format):
        print(wide.to_string())
    met = sum(t["met"] for t in checks)
    print(f"targets met on {met} of {len(checks)} runs (below saturation: |error| <= 5% at p50/p90, <= 10% at p99 of "
          f"TTFT, TPOT, E2EL; above: queue growth within 10%)")
    repeated = [t for t in checks if "met_against_range" in t]
    if repeated:
        print(f"runs below saturation measured more than once (results/continuous, {', '.join(repeats)}): "
              f"{len(repeated)}; targets met against the "
              f"range of the real runs of the same setup (no error between them), at each metric and percentile, "
              f"on {sum(t['met_against_range'] for t in repeated)}")
    moved = [t for t in checks if "met_within_cost_error" in t]
    if moved:
        print(f"targets met within the cost model's error (every pass {args.cost_error:.0%} shorter and longer; no "
              f"error where the real value lies between those simulations and the run's own) on "
              f"{sum(t['met_within_cost_error'] for t in moved)} of the {len(moved)} runs below saturation")
    carded = [t for t in checks if "card_met" in t]
    if carded:
        spread = sorted(t["card_offset"] for t in carded)
        print(f"targets met with each card's offset (the mean measured over priced pass time of its other runs at a "
              f"like load, {spread[0] - 1:+.1%} to {spread[-1] - 1:+.1%}) on {sum(t['card_met'] for t in carded)} of "
              f"the {len(carded)} runs whose card served others so ({sum(t['met'] for t in carded)} of them without)")
    for c in comparisons:
        print(f"  {c.run_id}: {c.diagnosis['verdict']}")
    if not args.no_charts:
        with tempfile.TemporaryDirectory() as scratch:
            pictures = charts(comparisons, out, Path(scratch))
            (out / "report.html").write_text(report_page(comparisons, checks, pictures, args.cost), encoding="utf-8")
    print(f"written {out / 'errors.csv'}, {out / 'targets.csv'}" + ("" if args.no_charts else f", {out / 'report.html'}"))
    return 0


def cmd_card_offset(args: argparse.Namespace) -> int:
    import statistics

    from sim.card import cards, run_offset
    from sim.compare import load_cost, measured_runs

    if not args.runs and not args.card:
        raise ValueError("name the runs to measure the card on (run ids), or --card GPU-...")
    found = measured_runs(args.results, tuple(args.repeats))
    keys = cards([row for row, _ in found])
    chosen = [(row, store, key) for (row, store), key in zip(found, keys)
              if row["run_id"] in args.runs or (args.card and key.startswith(args.card))]
    missing = sorted(set(args.runs) - {row["run_id"] for row, *_ in chosen})
    if missing:
        raise ValueError(f"no run {', '.join(missing)} under {args.results / 'continuous'} or "
                         + " or ".join(str(args.results / name) for name in args.repeats))
    if not chosen:
        raise ValueError(f"no runs under {args.results} on a card whose UUID starts with {args.card!r}")
    offsets = []
    for row, store, key in chosen:
        offsets.append(run_offset(load_cost(args.cost, row["model"]), store.passes(row["run_id"])))
        print(f"{row['run_id']}  {key}  {offsets[-1] - 1:+.2%}")
    mean = statistics.fmean(offsets)
    several = len({key for *_, key in chosen})
    print(f"mean of {len(offsets)} run{'s' if len(offsets) > 1 else ''}"
          + (f" (on {several} cards)" if several > 1 else "")
          + f": {mean - 1:+.2%} over the price; simulate the card with --cost '{args.cost}*{mean:.4f}'")
    return 0


def main(argv: list[str] | None = None, mapper=None) -> int:
    """`python -m sim COMMAND ...`; `mapper` (a function's `.map`: modal_app.py's simulate_point)
    runs a sweep's or capacity search's points instead of local processes."""
    from sim.compare import DEFAULT_REPEATS

    parser = ArgumentParser(prog="python -m sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="simulate one configuration")
    add_run_args(run, sweep=False)
    run.add_argument("--token-times", choices=["auto", "on", "off"], default="auto",
                     help=f"keep every token's time, and when each request was taken in and first scheduled "
                          f"(TTFT's stages) (auto: for traces up to {SMALL_TRACE:,} requests)")
    run.add_argument("--pass-log", choices=["auto", "on", "off"], default="auto",
                     help="keep a PassRecord per pass (auto: for traces up to 2,000 requests)")
    run.add_argument("--format", default=DEFAULT_FORMATS, metavar="FMT[,FMT]",
                     help=f"files for the request records under --out: {', '.join(FORMATS)} (default "
                          f"{DEFAULT_FORMATS}; parquet needs pyarrow: pip install 'llm-serving-sim[parquet]')")
    run.add_argument("--save-result", action="store_true",
                     help="also save the run's metrics as one JSON file, as vLLM's flag: "
                          "POLICY-RATEqps-MODEL-YYYYMMDD-HHMMSS.json in --result-dir")
    run.add_argument("--result-dir", type=Path, default=Path("."),
                     help="where --save-result puts its file (default: the current directory)")
    sw = sub.add_parser("sweep", help="simulate a grid of configurations in parallel")
    add_run_args(sw, sweep=True)
    sw.add_argument("--resume", action="store_true",
                    help="keep the runs already in --out/runs.csv and run only the missing grid points")
    cap = sub.add_parser("capacity", help="the highest rate, or the fewest replicas, that meets SLOs (bisection)")
    add_run_args(cap, sweep=True)
    cap.add_argument("--search", choices=("rate", "rate-scale", "replicas"), default="rate",
                     help="what to search: Poisson arrivals at RATE req/s with the trace's lengths (default), "
                          "the trace's own arrivals RATE_SCALE times faster, or the fewest replicas at the "
                          "load the other options give")
    cap.add_argument("--slo", nargs="+", required=True, metavar="NAME:STAT:MS",
                     help="SLOs every probe must meet, e.g. ttft:p99:200 tpot:p99:20 (NAME: ttft, tpot, itl, "
                          "e2el; STAT: mean, p50, p90, p99)")
    cap.add_argument("--start", type=float, default=None,
                     help="the first probe (default: the trace's mean rate; rate scale 1; 1 replica)")
    cap.add_argument("--tolerance", type=float, default=0.02,
                     help="rates: stop when the probes that meet and fail are this close, relative (default 0.02)")
    for p in (sw, cap):
        p.add_argument("--jobs", type=int, default=None, help="worker processes (default: one per CPU)")
        p.add_argument("--modal", action="store_true",
                       help=f"no longer here: run the points on Modal with modal run modal_app.py::{p.prog.split()[-1]} "
                            "--args \"...\"")
    cmp = sub.add_parser("compare", help="the simulator against the engine's open runs (results/continuous)",
                         description="Replay every open run under RESULTS/continuous in the simulator (same requests, "
                                     "policy, limits, replicas) and write the error table, the targets and a report "
                                     "page; runs of one setup measured more than once (under RESULTS/continuous, "
                                     "or again in the --repeats folders) give each run the engine's own "
                                     "spread and the error against the real runs' range.")
    cmp.add_argument("--results", type=Path, default=REPO / "results",
                     help="where the engine's runs are (continuous/, and the --repeats folders if present)")
    cmp.add_argument("--cost", default="calibrated:h200", help="the cost model (default calibrated:h200)")
    cmp.add_argument("--only", default=None, help="only runs whose id contains this")
    cmp.add_argument("--out", type=Path, default=None,
                     help="report directory (default RESULTS/validation, the committed report's; with --only, or "
                          "a --cost, --seeds, --cost-error or --card-offset other than the defaults, out/validation)")
    cmp.add_argument("--seeds", type=int, default=5,
                     help="simulations a run, pass and host times scattered as the calibration measured the engine's "
                          "own (its \"noise\"; sim/noise.py): each statistic their median, the range they span "
                          "beside it (default 5; 0: one simulation without scatter)")
    cmp.add_argument("--cost-error", type=float, default=0.02,
                     help="simulate each run below saturation again with every pass this much shorter and longer "
                          "(about the calibration's held-out error; default 0.02, 0: not), and hold the simulator "
                          "to the interval those results span as well")
    cmp.add_argument("--card-offset", action=argparse.BooleanOptionalAction, default=True,
                     help="also simulate each run whose card served other runs at a like load with every pass as "
                          "much longer or shorter as those runs' passes took over their price (sim/card.py), and "
                          "report the targets so (default: on)")
    cmp.add_argument("--no-charts", action="store_true", help="the tables only, no charts or report page")
    cmp.add_argument("--jobs", type=int, default=None,
                     help="worker processes, a run each (default: one per CPU; the same report as one process)")
    off = sub.add_parser("card-offset", help="how much longer a card runs the passes the cost model prices, from "
                                             "the engine's runs on it",
                         description="Each named run's passes' measured time over the cost model's price of them (heat "
                                     "included; sim/card.py), their mean, and the --cost that simulates that card: "
                                     "several runs at the load to simulate give a steadier figure than one.")
    off.add_argument("runs", nargs="*", help="run ids under RESULTS/continuous or a --repeats folder")
    off.add_argument("--card", default=None,
                     help="every run of the card whose GPU UUID starts with this (e.g. GPU-f145ba7b; rows record it "
                          "as gpu_uuid)")
    off.add_argument("--results", type=Path, default=REPO / "results", help="where the engine's runs are")
    for p in (cmp, off):
        p.add_argument("--repeats", nargs="+", default=list(DEFAULT_REPEATS), metavar="NAME",
                       help="folders under RESULTS of runs of the same setups measured again (default: "
                            f"{' '.join(DEFAULT_REPEATS)}; a folder that is not there is skipped)")
    off.add_argument("--cost", default="calibrated:h200", help="the cost model (default calibrated:h200)")
    add_plot_args(sub.add_parser("plot", help="charts (HTML and PNG) of runs and sweeps written with --out"))
    met = sub.add_parser("metrics", help="the metrics table of a run's records (requests.parquet, .jsonl or .csv)")
    met.add_argument("run", type=Path, help="a run's --out directory, or a request-records file")
    met.add_argument("--goodput", nargs="+", type=goodput_slo, default=[], metavar="NAME:MS",
                     help="SLOs for goodput, as vLLM")
    add_percentiles_arg(met)
    try:
        args = parser.parse_args(argv)
        args.mapper = mapper
        if getattr(args, "modal", False):
            raise ValueError(f"--modal: run it on Modal with modal run modal_app.py::{args.command} --args \"...\" "
                             "(the same options, without --modal)")
        if args.command == "compare":
            return cmd_compare(args)
        if args.command == "capacity":
            return cmd_capacity(args)
        if args.command == "card-offset":
            return cmd_card_offset(args)
        if args.command == "plot":
            return cmd_plot(args)
        if args.command == "metrics":
            return cmd_metrics(args)
        return cmd_run(args) if args.command == "run" else cmd_sweep(args)
    except (ValueError, FileNotFoundError, KeyError, DownloadError) as e:
        print(f"error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
