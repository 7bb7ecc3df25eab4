"""`python -m engine serve-trace`: open runs of the continuous engine.

A trace is replayed in real time (each request joins when its arrival time comes; `--replay
closed` hands every request over at t = 0) on the continuous engine, whose every pass the
shared scheduler (`core.scheduler`) plans. Workloads: the part0 workload, open (`--rates 1,3,5,7`:
Poisson arrivals, prompts drawn from p16..p4096, 256 output tokens), or any trace `traces` loads
(`--trace FILE` or a public trace's name, `--window START:END`, `--rate-scale`, `--limit`). A trace
row carries lengths, not text: its prompt is the prompt source text's tokens (the text the part0 workload's
p16..p4096 are cut from, repeated when a prompt is longer), cut to the row's length.

Each run (a rate, a rate scale or a policy of a list) writes `OUT/continuous/<run_id>/`
(request records and pass records, as they happen) and a row in OUT/continuous/runs.jsonl and
runs.csv: metrics from `core.metrics.compute_metrics`, the pass statistics, the configuration and
where it ran. An interrupted run keeps what it wrote and its row says `interrupted`.
"""
from __future__ import annotations

import argparse
import datetime as dt
import itertools
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from core.cli import SEED_MAX, ArgumentParser, check_writable_dir, goodput_slo, number
from core.config import resolve_model
from core.kv import BlockPool
from core.metrics import compute_metrics, format_rejections, parse_goodput
from core.roofline import GIB
from core.routers import ROUTERS
from core.runstore import OpenRunWriter, RunStore
from core.scheduler import ORDERS, POLICIES, make_scheduler
from engine.continuous import ModelRunner, Request, serve
from engine.kernels import choose_kernels
from engine.paged import PagedKVCache
from engine.prompts import _source_ids
from engine.provenance import device_memory, provenance, resolve_device
from engine.weights import load_model, parse_dtype
from traces.download import resolve_trace
from traces.generate import SEED_PROMPTS, fixed_prompts
from traces.io import load_trace
from traces.tools import shape_arrivals, window
from traces.trace import MAX_ARRIVAL_S, Trace

REPO = Path(__file__).resolve().parent.parent
ACTIVATION_RESERVE_GIB = 8.0  # left free beside the KV cache: activations, graphs, cuBLAS workspace


def prompt_tokens(n: int, checkpoint: str | None = None) -> list[int]:
    """The first n tokens of the prompt source text, repeated as often as a long prompt needs."""
    source = _source_ids(checkpoint)
    reps = -(-n // len(source))
    return list((source * reps)[:n])


def requests_of(trace: Trace, vocab_size: int, checkpoint: str | None = None) -> list[Request]:
    ids = trace.ids()
    return [Request(ids[i], float(trace.arrival_s[i]),
                    [t % vocab_size for t in prompt_tokens(int(trace.prompt_tokens[i]), checkpoint)],
                    int(trace.output_tokens[i])) for i in range(len(trace))]


def listed(kind):
    def parse(text: str) -> list:
        try:
            return [kind(v) for v in text.split(",")]
        except ValueError:
            raise ValueError(f"expected comma-separated {kind.__name__} values, got {text!r}") from None
    return parse


def run_name(text: str) -> str:
    """`--name`: the start of every run id, so also a directory name: no path separators."""
    if not text or "/" in text or "\\" in text or text in (".", ".."):
        raise argparse.ArgumentTypeError(f"a run name is a plain name (it names a directory), got {text!r}")
    return text


COUNT, TOKENS = number(int, low=1), number(int, low=1)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m engine serve-trace", description=__doc__.split("\n\n")[0])
    w = p.add_argument_group("workload (one of --rates and --trace)")
    w.add_argument("--rates", type=listed(float), default=None,
                   help="the part0 workload (prompts p16 ... p4096, 256 greedy tokens), open, at each of these rates (req/s), one run each, e.g. 1,3,5,7")
    w.add_argument("--requests", type=COUNT, default=None, help="the part0 workload: requests per rate (default 60)")
    w.add_argument("--duration", type=number(above=0, high=MAX_ARRIVAL_S), default=None,
                   help="the part0 workload: or seconds of arrivals per rate")
    w.add_argument("--output-tokens", type=TOKENS, default=256, help="the part0 workload: tokens per request (256)")
    w.add_argument("--trace", default=None, help="a trace file, or a public trace's name (azure-conv-2023)")
    w.add_argument("--window", default=None, metavar="START:END", help="trace: only [START, END) seconds")
    w.add_argument("--rate-scale", type=listed(float), default=[1.0],
                   help="trace: replay this many times faster; a list makes one run each")
    w.add_argument("--limit", type=COUNT, default=None, help="only the first N requests")
    w.add_argument("--seed", type=number(int, low=0, high=SEED_MAX), default=0)
    w.add_argument("--replay", choices=("realtime", "closed"), default="realtime",
                   help="realtime: requests join at their arrival times; closed: all at t = 0")
    s = p.add_argument_group("scheduler")
    s.add_argument("--policy", type=listed(str), default=["continuous"],
                   help=f"{' | '.join(POLICIES)}; a list makes one run each (default continuous)")
    s.add_argument("--order", default="fcfs", choices=list(ORDERS))
    s.add_argument("--max-num-seqs", type=COUNT, default=256)
    s.add_argument("--max-num-batched-tokens", type=TOKENS, default=None,
                   help="token budget per pass (default: the policy's)")
    s.add_argument("--max-model-len", type=number(int, low=2), default=None, help="default: the model's context")
    s.add_argument("--block-size", type=TOKENS, default=16)
    s.add_argument("--kv-gib", type=number(above=0), default=None,
                   help=f"memory for the KV cache (default: what is free after loading, less {ACTIVATION_RESERVE_GIB:g} GiB)")
    s.add_argument("--kv-blocks", type=COUNT, default=None, help="or the KV cache size in blocks")
    s.add_argument("--preemption", default="recompute", choices=("recompute", "swap"))
    s.add_argument("--batch-size", type=COUNT, default=8, help="static: requests per batch")
    s.add_argument("--batch-timeout-s", type=number(low=0, high=MAX_ARRIVAL_S), default=0.5,
                   help="static: longest wait for a full batch")
    e = p.add_argument_group("engine")
    e.add_argument("--model", default=None, help="preset (random weights) or checkpoint directory "
                                                 "(default qwen2.5-1.5b on a GPU, tiny on the CPU)")
    e.add_argument("--dtype", default="float16")
    e.add_argument("--device", default="auto")
    e.add_argument("--kernels", choices=("triton", "eager"), default=None,
                   help="fused Triton kernels (default on a GPU) or plain PyTorch (default on a CPU)")
    e.add_argument("--graphs", choices=("auto", "on", "off"), default="auto",
                   help="decode passes as CUDA graphs at padded batch buckets (auto: on a GPU with triton)")
    e.add_argument("--overlap", choices=("on", "off"), default="on",
                   help="plan and launch the next pass while the GPU runs this one (default on)")
    e.add_argument("--replicas", type=COUNT, default=1,
                   help="engine replicas, one process and one GPU each, behind --router (default 1)")
    e.add_argument("--router", type=listed(str), default=["round-robin"],
                   help=f"how requests pick a replica: {' | '.join(ROUTERS)}; a list makes one run each")
    e.add_argument("--goodput", nargs="+", type=goodput_slo, default=[], metavar="NAME:MS",
                   help="SLOs: ttft:MS tpot:MS e2el:MS")
    e.add_argument("--out", default=None, help="results directory (default results/ on a GPU, out/results/ on a CPU)")
    e.add_argument("--name", type=run_name, default=None, help="a name for the runs (default: the workload's)")
    return p


def workloads(args, vocab: int, checkpoint: str | None) -> list[tuple[str, dict, Trace]]:
    """(label, description, trace) of every run the arguments ask for (before the policy axis)."""
    if (args.rates is None) == (args.trace is None):
        raise ValueError("give one workload: --rates (the part0 workload, open) or --trace")
    out = []
    if args.rates is not None:
        if args.requests is not None and args.duration is not None:
            raise ValueError("--requests and --duration: give one")
        for rate in args.rates:
            if not rate > 0:
                raise ValueError(f"--rates: a rate must be positive, got {rate}")
            n = None if args.duration is not None else (60 if args.requests is None else args.requests)
            trace = fixed_prompts(n, rate, SEED_PROMPTS, args.output_tokens, args.duration, args.seed)
            out.append((f"seed-r{rate:g}", {"workload": "seed", "rate": rate, "rate_scale": None, "window": None},
                        trace))
        return out
    trace = load_trace(resolve_trace(args.trace))
    if args.window is not None:
        try:
            start, end = (float(v) for v in args.window.split(":"))
        except ValueError:
            raise ValueError(f"--window {args.window!r}: expected START:END in seconds") from None
        if not (math.isfinite(start) and math.isfinite(end) and end > start):
            raise ValueError(f"--window {args.window!r}: expected finite seconds START < END")
        trace = window(trace, start, end)
        if not len(trace):
            raise ValueError(f"--window {args.window!r}: no request of {args.trace} arrives in it")
    for scale in args.rate_scale:
        if not scale > 0:
            raise ValueError(f"--rate-scale: must be positive, got {scale}")
        shaped = shape_arrivals(trace, None, scale, args.limit, args.seed)
        if shaped.arrival_s[-1] > MAX_ARRIVAL_S:
            raise ValueError(f"--rate-scale {scale:g}: the arrivals would run to {shaped.arrival_s[-1]:.3g} s, past "
                             f"the {MAX_ARRIVAL_S:g} s a trace may span")
        label = f"{Path(str(args.trace)).stem[:24]}{'-w' + args.window.replace(':', '-') if args.window else ''}-x{scale:g}"
        out.append((label, {"workload": str(args.trace), "rate": None, "rate_scale": scale, "window": args.window},
                    shaped))
    return out


def pool_blocks(args, model, dtype, device) -> int:
    block_size = args.block_size
    if args.kv_blocks is not None:
        return args.kv_blocks
    if args.kv_gib is not None:
        nbytes = args.kv_gib * GIB
    elif device.type == "cuda":
        nbytes = torch.cuda.mem_get_info(device)[0] - ACTIVATION_RESERVE_GIB * GIB
    else:
        nbytes = 1 * GIB
    return PagedKVCache.blocks_that_fit(model.config, nbytes, block_size, dtype)


def check_cache_fits(config, num_blocks: int, block_size: int, dtype, device) -> None:
    """Refuse a KV cache larger than the device's whole memory before trying to allocate it."""
    need = num_blocks * block_size * config.kv_bytes_per_token(torch.finfo(dtype).bits // 8)
    total = device_memory(device)
    if need > total:
        raise ValueError(f"--kv-gib / --kv-blocks: a KV cache of {num_blocks:,} blocks needs {need / GIB:,.1f} GiB, "
                         f"more than the {total / GIB:,.1f} GiB this {device.type} has")


def pass_stats(passes) -> dict:
    """Mean batch size, padding, host time and the GPU's idle gaps between passes (within each
    replica)."""
    if not passes:
        return {}
    gaps, busy, span = [], 0.0, 0.0
    for r in sorted({p.replica for p in passes}):
        mine = [p for p in passes if p.replica == r]
        gaps += [b.start_s - (a.start_s + a.duration_s) for a, b in zip(mine, mine[1:])]
        busy += sum(p.duration_s for p in mine)
        span += mine[-1].start_s + mine[-1].duration_s - mine[0].start_s
    return {"passes": len(passes), "mean_batch_size": statistics.fmean(p.batch_size for p in passes),
            "decode_passes": sum(p.kind == "decode" for p in passes),
            "graph_passes": sum(p.mode == "graph" for p in passes),
            "median_gap_us": statistics.median(gaps) * 1e6 if gaps else None,
            "p90_gap_us": float(np.percentile(gaps, 90)) * 1e6 if gaps else None,
            "median_host_us": statistics.median(p.host_s for p in passes) * 1e6,
            "busy_fraction": busy / max(1e-9, span)}


def stages(metrics) -> str:
    """", TTFT p50 by stage: intake X, queue Y, prefill Z ms" where the records time them, else ""."""
    if metrics.intake is None:
        return ""
    return (f", TTFT p50 by stage: intake {metrics.intake.median * 1e3:.1f}, queue {metrics.queue.median * 1e3:.1f}, "
            f"prefill {metrics.prefill.median * 1e3:.1f} ms")


def scheduler_options(args, max_model_len: int) -> dict:
    return {"max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
            "max_model_len": max_model_len, "order": args.order, "preemption": args.preemption,
            "batch_size": args.batch_size, "batch_timeout_s": args.batch_timeout_s}


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        device = resolve_device(args.device)
        dtype = parse_dtype(args.dtype)
        slos = parse_goodput(args.goodput)
        kernels = choose_kernels(args.kernels or ("triton" if device.type == "cuda" else "eager"))
        graphs = args.graphs == "on" or (args.graphs == "auto" and device.type == "cuda" and kernels == "triton")
        if graphs and device.type != "cuda":
            raise ValueError("--graphs on: CUDA graphs need a CUDA device")
        for policy in args.policy:
            if policy not in POLICIES:
                raise ValueError(f"--policy: unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
        for router in args.router:
            if router not in ROUTERS:
                raise ValueError(f"--router: unknown router {router!r}; choose from {', '.join(ROUTERS)}")
        if args.replicas > 1 and args.replay != "realtime":
            raise ValueError("--replicas: several replicas replay a trace in real time only (not --replay closed)")
        if args.replicas > 1 and device.type == "cuda" and torch.cuda.device_count() < args.replicas:
            raise ValueError(f"--replicas {args.replicas}: one GPU a replica, and torch sees "
                             f"{torch.cuda.device_count()}")
        source = args.model or ("qwen2.5-1.5b" if device.type == "cuda" else "tiny")
        checkpoint = source if Path(source).is_dir() else None
        out = Path(args.out) if args.out else REPO / ("results" if device.type == "cuda" else "out/results")
        check_writable_dir(out)
        if args.replicas == 1:
            model, weights = load_model(source, dtype, device, seed=args.seed)
            config = model.config
        else:  # the replicas load the model on their own GPUs; this process only routes
            config = resolve_model(source)
            weights = "checkpoint" if checkpoint else "random"
        runs = workloads(args, config.vocab_size, checkpoint)
        max_model_len = args.max_model_len or config.context_length
        if max_model_len > config.context_length:
            raise ValueError(f"--max-model-len {max_model_len} is past the model's context of "
                             f"{config.context_length}")
        runner = None
        if args.replicas == 1:
            num_blocks = pool_blocks(args, model, dtype, device)
            if num_blocks < 1:
                raise ValueError("--kv-gib / --kv-blocks: no room for a single KV block")
            check_cache_fits(config, num_blocks, args.block_size, dtype, device)
            try:
                cache = PagedKVCache(config, num_blocks, args.block_size, dtype, device)
            except torch.cuda.OutOfMemoryError:
                raise ValueError(f"a KV cache of {num_blocks} blocks does not fit in the GPU's memory; lower "
                                 f"--kv-gib") from None
        else:
            num_blocks = args.kv_blocks or (PagedKVCache.blocks_that_fit(config, args.kv_gib * GIB, args.block_size,
                                                                         dtype) if args.kv_gib else None)
        # every scheduler must be buildable before anything runs
        budgets = [make_scheduler(policy, BlockPool(num_blocks or 1 << 24, args.block_size),
                                  **scheduler_options(args, max_model_len)).max_num_batched_tokens
                   for policy in args.policy]
        if args.replicas == 1:
            runner = ModelRunner(model, cache, args.max_num_seqs, kernels, graphs)
            runner.warm_up(max(budgets))
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    store = RunStore(out / "continuous")
    meta = {"model": config.name, "weights": weights, "dtype": str(dtype).removeprefix("torch."),
            "device": device.type, **provenance(device, args.replicas if device.type == "cuda" else 1)}
    print(f"model {source} ({weights} weights) on {meta['gpu']}, {args.replicas} replica(s), "
          f"{f'{num_blocks:,}' if num_blocks else 'the free memory in'} KV blocks of {args.block_size}, kernels "
          f"{kernels}{' + CUDA graphs' if graphs else ''}, overlap {args.overlap}; runs go to {store.root}")
    routers = args.router if args.replicas > 1 else [None]
    interrupted = False
    for (label, workload, trace), policy, router in itertools.product(runs, args.policy, routers):
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
        run_id = f"{args.name or label}-{policy}{f'-x{args.replicas}-{router}' if router else ''}-{stamp}"
        reqs = requests_of(trace, config.vocab_size, checkpoint)
        bar = tqdm(total=len(reqs), desc=run_id[:40], unit="req", file=sys.stderr, mininterval=1.0)
        if runner is not None:
            result, extra = serve_one(args, policy, reqs, runner, store, run_id, num_blocks, max_model_len, bar)
        else:
            result, extra = serve_cluster(args, policy, router, reqs, store, run_id, source, kernels, graphs,
                                          max_model_len, bar)
            num_blocks = min(extra["kv_blocks_per_replica"])
        bar.close()
        metrics = compute_metrics(result.requests, slos)
        row = {"run_id": run_id, "engine": "continuous", "policy": policy, **workload, "replay": args.replay,
               "requests": len(reqs), "status": "interrupted" if result.interrupted else "ok",
               "replicas": args.replicas, "router": router, "overlap": args.overlap == "on", "kernels": kernels,
               "graphs": graphs, "max_num_seqs": args.max_num_seqs,
               "max_num_batched_tokens": extra["max_num_batched_tokens"], "max_model_len": max_model_len,
               "block_size": args.block_size, "kv_blocks": num_blocks, "preemption": args.preemption,
               "order": args.order, "wall_s": result.wall_s, **metrics.as_row(), **pass_stats(result.passes),
               **{k: v for k, v in extra.items() if k != "max_num_batched_tokens"}, **meta}
        store.append_row(row)
        print(f"{run_id}: {metrics.completed} done, {metrics.rejected} rejected, "
              f"{metrics.output_throughput:,.0f} tok/s, TTFT p50 {metrics.ttft.median * 1e3:.1f} ms "
              f"p99 {metrics.ttft.percentiles.get(99.0, float('nan')) * 1e3:.1f} ms, TPOT p50 "
              f"{metrics.tpot.median * 1e3:.2f} ms"
              f"{stages(metrics)}, mean batch {row.get('mean_batch_size', 0):.1f}, "
              f"GPU idle between passes p50 {row.get('median_gap_us') or 0:.0f} us"
              f"{(', requests per replica ' + str(extra['requests_per_replica'])) if router else ''}"
              f"{' (interrupted)' if result.interrupted else ''}")
        if refused := format_rejections(result.requests):
            print(refused, file=sys.stderr)
        if result.interrupted:
            interrupted = True
            break
    return 130 if interrupted else 0


def serve_one(args, policy, reqs, runner, store, run_id, num_blocks, max_model_len, bar):
    """One run on this process's engine, its records written as they happen."""
    scheduler = make_scheduler(policy, BlockPool(num_blocks, args.block_size), **scheduler_options(args, max_model_len))
    writer = OpenRunWriter(store, run_id)

    def progress(sched, done, total):
        bar.n = done
        bar.set_postfix_str(f"running {len(sched.running)}, waiting {len(sched.waiting)}, "
                            f"KV {sched.kv.used_blocks()}/{sched.kv.num_blocks}", refresh=False)
        bar.refresh() if done == total else None

    try:
        result = serve(reqs, scheduler, runner, run_id=run_id, overlap=args.overlap == "on",
                       realtime=args.replay == "realtime", on_request=writer.request, on_pass=writer.pass_done,
                       progress=progress, while_waiting=writer.write_while)
    finally:
        writer.close()
    return result, {"max_num_batched_tokens": scheduler.max_num_batched_tokens}


def serve_cluster(args, policy, router, reqs, store, run_id, source, kernels, graphs, max_model_len, bar):
    """One run on `--replicas` replica processes behind `router`, their records merged."""
    from engine.cluster import WorkerSpec, run_cluster
    from engine.continuous import ServeResult

    if args.replay != "realtime":
        raise ValueError("several replicas replay a trace in real time only")
    options = scheduler_options(args, max_model_len)
    spec = WorkerSpec(model=source, dtype=args.dtype, seed=args.seed, device=resolve_device(args.device).type,
                      kernels=kernels, graphs=graphs, overlap=args.overlap == "on", policy=policy, scheduler=options,
                      kv_blocks=args.kv_blocks, kv_gib=args.kv_gib, block_size=args.block_size,
                      reserve_gib=ACTIVATION_RESERVE_GIB)

    def progress(sent, total, handles):
        bar.n = sent
        bar.set_postfix_str(", ".join(f"replica {h.index}: {h.num_outstanding} out" for h in handles), refresh=False)

    wall = time.perf_counter()
    info = run_cluster(reqs, spec, args.replicas, router, store.run_dir(run_id), run_id, seed=args.seed,
                       progress=progress)
    requests = store.requests(run_id)
    passes = store.passes(run_id)
    budget = make_scheduler(policy, BlockPool(min(info["kv_blocks_per_replica"]), args.block_size),
                            **options).max_num_batched_tokens
    return (ServeResult(requests, passes, info["interrupted"], time.perf_counter() - wall, {}),
            {"max_num_batched_tokens": budget, **info})
