"""Command line: `python -m sim run` simulates one configuration, `python -m sim sweep` a grid.

    python -m sim run --trace FILE --policy continuous --cost roofline:h200 [--replicas 2] [--out DIR]
    python -m sim sweep --trace FILE --policy continuous,chunked --rate-scale 1,2 --replications 3

`run` prints a vLLM-style metrics table and, with --out, writes the request records
(requests.jsonl, requests.csv), the pass records (passes.jsonl, passes.csv) when kept, and
metrics.json. `sweep` prints one summary line per grid point and writes runs.csv and
summary.csv (means with confidence intervals over replications) under --out.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sim.build import ORDERS, POLICIES, ROUTERS, RunSpec, load_trace_file, simulate_spec
from sim.metrics import (compute_metrics, format_metrics, format_replications, parse_goodput,
                         summarize_replications)
from sim.records import records_to_csv, write_jsonl

SMALL_TRACE = 5000  # "auto" keeps token times up to this many requests, pass records up to 2000


def add_run_args(p: argparse.ArgumentParser, sweep: bool) -> None:
    many = (lambda kind: (lambda s: [kind(v) for v in s.split(",")])) if sweep else (lambda kind: kind)
    lists = " (comma-separated values sweep it)" if sweep else ""
    p.add_argument("--trace", required=True, help="trace file: the project's CSV, or any format traces.io reads")
    p.add_argument("--format", dest="trace_format", default=None,
                   help="trace format (project, azure, burstgpt, mooncake); detected when omitted")
    p.add_argument("--policy", type=many(str), default="continuous",
                   help=f"{' | '.join(POLICIES)} (default continuous){lists}")
    p.add_argument("--cost", default="roofline:h200",
                   help="roofline:GPU (a preset: h200, h100-sxm, a100-80gb, a10, ...), constant:SECONDS, "
                        "or a calibration JSON (format llm-sim-cost/v1; see sim/cost.py)")
    p.add_argument("--model", default="qwen2.5-1.5b", help="model preset; a calibration file must match it")
    p.add_argument("--gpu", default="h200", help="GPU preset sizing the KV cache when --cost doesn't name one")
    p.add_argument("--overhead-ms", type=float, default=0.3, help="roofline per-pass overhead (default 0.3)")
    p.add_argument("--replicas", type=many(int), default=1, help=f"replicas behind the router{lists}")
    p.add_argument("--router", default="round-robin", choices=list(ROUTERS))
    p.add_argument("--order", default="fcfs", choices=list(ORDERS),
                   help="queue order: fcfs, priority (the trace's priority classes), spf (shortest prompt first)")
    p.add_argument("--max-num-seqs", type=many(int), default=256, help=f"most running sequences{lists}")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="token budget per pass (default: max(max-model-len, 2048); chunked 2048)")
    p.add_argument("--max-model-len", type=int, default=None, help="longest prompt+output (default: the model's)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-blocks", type=int, default=None, help="KV cache size in blocks (default: GPU free memory)")
    p.add_argument("--kv-gib", type=float, default=None, help="or memory for the KV cache, GiB")
    p.add_argument("--preemption", default="recompute", choices=["recompute", "swap"])
    p.add_argument("--swap-gbs", type=float, default=25.0, help="host<->GPU bandwidth for swap (GB/s)")
    p.add_argument("--batch-size", type=int, default=8, help="static: requests per batch")
    p.add_argument("--batch-timeout-s", type=float, default=0.5, help="static: longest wait for a full batch")
    p.add_argument("--prefix-caching", action="store_true", help="reuse prompt blocks by the trace's block hashes")
    p.add_argument("--hash-block-tokens", type=int, default=512, help="tokens per trace block hash (Mooncake: 512)")
    p.add_argument("--disaggregate", default=None, metavar="P:D",
                   help="P prefill and D decode replicas instead of --replicas")
    p.add_argument("--kv-link-gbs", type=float, default=50.0, help="disaggregation: KV transfer bandwidth, GB/s")
    p.add_argument("--kv-link-latency-ms", type=float, default=0.0)
    p.add_argument("--rate", type=many(float), default=None,
                   help=f"Poisson arrivals at this many req/s (seeded), lengths from the trace{lists}")
    p.add_argument("--rate-scale", type=many(float), default=1.0,
                   help=f"replay the trace's own arrivals this many times faster{lists}")
    p.add_argument("--limit", type=int, default=None, help="only the first N requests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replications", type=int, default=1, help="runs with seeds seed, seed+1, ...")
    p.add_argument("--goodput", nargs="+", default=[], metavar="NAME:MS",
                   help="SLOs for goodput, as vLLM: ttft:MS tpot:MS e2el:MS")
    p.add_argument("--out", type=Path, default=None, help="directory for records and metrics")
    p.add_argument("--no-fast-forward", dest="fast_forward", action="store_false",
                   help="step every pass (same results, slower)")


def spec_from_args(args: argparse.Namespace, **axes) -> RunSpec:
    """The RunSpec the flags describe (`axes` override the flags a sweep varies)."""
    prefill = decode = 0
    if args.disaggregate:
        try:
            prefill, decode = (int(v) for v in args.disaggregate.split(":"))
        except ValueError:
            raise ValueError(f"--disaggregate {args.disaggregate!r}: expected P:D, e.g. 1:3") from None
    values = dict(
        trace=args.trace, trace_format=args.trace_format, policy=args.policy, cost=args.cost, model=args.model,
        gpu=args.gpu, overhead_s=args.overhead_ms / 1e3, replicas=args.replicas, router=args.router,
        order=args.order, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len, block_size=args.block_size, kv_blocks=args.kv_blocks,
        kv_gib=args.kv_gib, preemption=args.preemption, swap_gbs=args.swap_gbs, batch_size=args.batch_size,
        batch_timeout_s=args.batch_timeout_s, prefix_caching=args.prefix_caching,
        hash_block_tokens=args.hash_block_tokens, prefill_replicas=prefill, decode_replicas=decode,
        kv_link_gbs=args.kv_link_gbs, kv_link_latency_s=args.kv_link_latency_ms / 1e3, rate=args.rate,
        rate_scale=args.rate_scale, limit=args.limit, seed=args.seed, fast_forward=args.fast_forward)
    values.update(axes)
    return RunSpec(**values)


def cmd_run(args: argparse.Namespace) -> int:
    slos = parse_goodput(args.goodput)
    spec = spec_from_args(args)
    n = len(load_trace_file(spec.trace, spec.trace_format))
    n = min(n, spec.limit or n)
    keep_times = {"auto": n <= SMALL_TRACE, "on": True, "off": False}[args.token_times]
    log_passes = {"auto": n <= 2000, "on": True, "off": False}[args.pass_log]
    where = (f"{spec.prefill_replicas} prefill + {spec.decode_replicas} decode replicas" if spec.prefill_replicas
             else f"{spec.replicas} replica{'s' if spec.replicas > 1 else ''}")
    rows = []
    for i in range(args.replications):
        run = spec.with_(seed=spec.seed + i, keep_token_times=keep_times, log_passes=log_passes,
                         run_id=f"sim-{spec.policy}-s{spec.seed + i}")
        result = simulate_spec(run)
        metrics = compute_metrics(result.requests, slos)
        rows.append(metrics.as_row())
        if i == 0:
            print(format_metrics(metrics, f" {spec.policy}, {where}, {spec.cost} "))
            print(f"simulated {result.num_passes:,} passes to t={result.end_s:,.1f} s in {result.wall_s:.2f} s wall"
                  f"{'' if log_passes else ' (pass records off)'}")
            if spec.prefix_caching:
                print(f"prefix cache: {result.prefix_hit_tokens:,} prompt tokens hit "
                      f"({result.prefix_hit_tokens / max(1, metrics.total_input_tokens):.1%} of all prompt tokens)")
        if args.out is not None:
            out = args.out if args.replications == 1 else args.out / f"rep{i}"
            write_jsonl(result.requests, out / "requests.jsonl")
            records_to_csv(result.requests, out / "requests.csv")
            if log_passes:
                write_jsonl(result.passes, out / "passes.jsonl")
                records_to_csv(result.passes, out / "passes.csv")
            (out / "metrics.json").write_text(json.dumps(
                {"spec": run.__dict__, "metrics": rows[-1], "passes": result.num_passes,
                 "wall_s": result.wall_s}, indent=1, default=str))
    if args.replications > 1:
        print(format_replications(summarize_replications(rows), args.replications))
        if spec.rate is None and spec.router != "power-of-two":
            print("note: replications differ only through seeded randomness (--rate, power-of-two); "
                  "these were identical")
    if args.out is not None:
        print(f"records written under {args.out}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from sim.sweep import grid, summarize, sweep
    slos = parse_goodput(args.goodput)
    axes = {"policy": args.policy, "max_num_seqs": args.max_num_seqs, "replicas": args.replicas,
            "rate": args.rate, "rate_scale": args.rate_scale}
    axes = {k: (v if isinstance(v, list) else [v]) for k, v in axes.items() if v is not None}
    base = spec_from_args(args, **{k: v[0] for k, v in axes.items()})
    specs = grid(base, args.replications, **axes)
    for spec in specs:  # fail early, in this process, on a bad name
        RunSpec(**spec.__dict__)
    rows = sweep(specs, slos, jobs=args.jobs)
    metrics = ["request_throughput", "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
               "p99_tpot_ms"] + (["request_goodput"] if slos else [])
    summary = summarize(rows, metrics)
    import pandas as pd
    table = pd.DataFrame(summary)
    fixed = [c for c in (*axes, "replications") if table[c].nunique(dropna=False) == 1]
    shown = table.drop(columns=fixed + [c for c in table if c.endswith("_ci") and table[c].isna().all()]
                       + [a for a in ("rate", "rate_scale", "policy", "max_num_seqs", "replicas") if a not in axes])
    print(", ".join(f"{c}={table[c].iloc[0]}" for c in fixed))
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.float_format", "{:.2f}".format):
        print(shown.to_string(index=False))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_csv(args.out / "runs.csv", index=False)
        table.to_csv(args.out / "summary.csv", index=False)
        print(f"written {args.out / 'runs.csv'} and {args.out / 'summary.csv'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="simulate one configuration")
    add_run_args(run, sweep=False)
    run.add_argument("--token-times", choices=["auto", "on", "off"], default="auto",
                     help=f"keep every token's time (auto: for traces up to {SMALL_TRACE:,} requests)")
    run.add_argument("--pass-log", choices=["auto", "on", "off"], default="auto",
                     help="keep a PassRecord per pass (auto: for traces up to 2,000 requests)")
    sw = sub.add_parser("sweep", help="simulate a grid of configurations in parallel")
    add_run_args(sw, sweep=True)
    sw.add_argument("--jobs", type=int, default=None, help="worker processes (default: one per CPU)")
    args = parser.parse_args(argv)
    try:
        return cmd_run(args) if args.command == "run" else cmd_sweep(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
