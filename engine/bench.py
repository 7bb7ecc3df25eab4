"""The benchmark harness for closed runs: warm-ups, then recorded runs, per (engine, prompt, batch).

A closed run hands the whole batch to the engine at once (every request arrives at t = 0).
Each recorded run becomes a request record per sequence, and its metrics come from
`core.metrics.compute_metrics`, the function the simulator and the open runs use, under vLLM's
names (mean/median/p99 TTFT, TPOT, ITL, E2EL, throughputs). The run is written to
`<out>/<engine>/` through `core.runstore.RunStore`: its records in `<run_id>/` (requests.jsonl,
passes.jsonl.gz), then its row in runs.jsonl and runs.csv. After each configuration a line
prints the mean and median over the recorded runs and, on a GPU, the memory bandwidth decode
achieved against the card's floor.

On a GPU the rows go to results/ by default; on a CPU (a smoke run) to out/results/, never into
the committed GPU rows unless --out says so.
"""
from __future__ import annotations

import datetime as dt
import functools
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from core.cli import SEED_MAX, ArgumentParser, check_writable_dir, number
from core.config import PRESETS
from core.metrics import compute_metrics
from core.roofline import GIB, GPUS, get_gpu, roofline
from core.runstore import RunStore
from engine.engines import ENGINES, Generation, check_fits, generate
from engine.kernels import choose_kernels
from engine.prompts import PROMPT_LENGTHS, batch_prompts, longest_prompt, parse_prompts
from engine.provenance import device_memory, provenance, resolve_device
from engine.weights import load_model, parse_dtype

BENCH_ENGINES = ENGINES + ("continuous", "hf")
# where each engine's closed runs go (the continuous engine's open runs have results/continuous)
STORE_NAMES = {"continuous": "continuous-closed"}
REPO = Path(__file__).resolve().parent.parent
# A CPU run (the tiny model, a smoke test) is quick by default: three prompts, 32 tokens, 1+2 runs.
CPU_DEFAULTS = {"prompts": "p16,p64,p256", "new_tokens": 32, "warmup": 1, "runs": 2}
GPU_DEFAULTS = {"prompts": ",".join(PROMPT_LENGTHS), "new_tokens": 256, "warmup": 2, "runs": 5}


def parse_batch_sizes(spec: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; every size must be a positive integer."""
    sizes = []
    for part in spec.split(","):
        part = part.strip()
        try:
            size = int(part)
        except ValueError:
            raise ValueError(f"--batch-size: {part!r} is not an integer") from None
        if size <= 0:
            raise ValueError(f"--batch-size: batch size must be >= 1, got {size}")
        sizes.append(size)
    return sizes


@dataclass
class Setup:
    """What stays fixed across a benchmark invocation."""

    model: torch.nn.Module
    new_tokens: int
    warmup: int
    runs: int
    meta: dict            # provenance + model/roofline fields copied into every row
    weight_bytes: int
    store_root: Path
    stamp: str                      # when the invocation started, in every run id
    decoder_factory: object = None  # callable(model) -> decoder for the CUDA-graph path, or None
    mode: str = "eager"
    hf: object = None               # the Hugging Face baseline, built on first use
    runner: object = None           # the continuous engine's runner, built on first use

    def continuous_runner(self, batch: int, tokens_per_seq: int):
        """The continuous engine's runner with a cache for this batch (built once for the largest
        batch asked for: `max_batch`, `max_tokens`)."""
        if self.runner is None:
            from engine.continuous import ModelRunner
            from engine.paged import PagedKVCache
            device = self.model.embed_tokens.weight.device
            blocks = self.max_batch * -(-self.max_tokens // 16)
            cache = PagedKVCache(self.model.config, blocks, 16, self.model.embed_tokens.weight.dtype, device)
            gpu = device.type == "cuda"
            self.runner = ModelRunner(self.model, cache, self.max_batch, choose_kernels("triton" if gpu else "eager"),
                                      graphs=gpu and self.decoder_factory is not None, small_max=self.small_max)
        return self.runner

    max_batch: int = 1
    max_tokens: int = 1
    small_max: int | None = None    # decode batches 2..small_max on the small-batch kernels (None: the engine's default)
    last_pass_end: float | None = None  # perf_counter time the continuous engine's last run ended


def run_row(gen: Generation, engine: str, prompt: str, batch: int, index: int, setup: Setup,
            run_id: str, mode: str) -> dict:
    """One recorded run as a result row: its configuration, the metrics of its request records
    (vLLM's names, latencies in ms), decode throughput and the weight bandwidth it implies."""
    records = gen.request_records(run_id)
    metrics = compute_metrics(records).as_row()
    itl_s = metrics["mean_itl_ms"] / 1e3
    row = {"engine": engine, "mode": mode, "prompt": prompt, "prompt_tokens": round(statistics.fmean(gen.prompt_lens)),
           "batch_size": batch, "new_tokens": len(gen.step_times_s), "run": index, "status": "ok",
           "error": None, "run_id": run_id}
    row.update(metrics)
    row["decode_tokens_per_s"] = batch / itl_s if itl_s > 0 else float("nan")
    row["weight_gb_s"] = setup.weight_bytes / itl_s / 1e9 if itl_s > 0 else float("nan")
    return row | setup.meta


def failure_row(engine: str, prompt: str, batch: int, status: str, error: str, setup: Setup) -> dict:
    return {"engine": engine, "mode": setup.mode, "prompt": prompt, "prompt_tokens": longest_prompt(prompt),
            "batch_size": batch, "new_tokens": setup.new_tokens, "run": None, "status": status,
            "error": error, "run_id": None} | setup.meta


def summarize(rows: list[dict], setup: Setup) -> str:
    """Mean / median over the recorded runs, and on a GPU the bandwidth decode achieved."""
    def mm(key: str) -> tuple[float, float]:
        values = [r[key] for r in rows]
        return statistics.fmean(values), statistics.median(values)

    r0 = rows[0]
    ttft, itl, tok = mm("mean_ttft_ms"), mm("mean_itl_ms"), mm("decode_tokens_per_s")
    line = (f"{r0['engine']:>8} {r0['prompt']:>6} B={r0['batch_size']:<5} TTFT {ttft[0]:8.2f} / {ttft[1]:8.2f} ms  "
            f"ITL {itl[0]:7.3f} / {itl[1]:7.3f} ms  {tok[0]:10.1f} / {tok[1]:10.1f} tok/s")
    floor_ms = setup.meta["roofline_floor_ms"]
    if floor_ms is not None:
        gbs = setup.weight_bytes / (itl[1] / 1e3) / 1e9
        line += f"  weights {gbs:7.1f} GB/s ({100 * floor_ms / itl[1]:5.1f}% of the {floor_ms:.3f} ms floor)"
    return line


def gpu_idle_before(clock, passes: list, last_end: float | None) -> tuple[float | None, float]:
    """(seconds the GPU idled between the end of the continuous engine's previous run, `last_end`,
    and this run's first pass, None without one; when this run's last pass ended), on the host's
    clock (perf_counter: a run's clock's 0 is `PassClock.t0`). A first pass after a longer rest
    runs on a colder GPU."""
    start = clock.t0 + passes[0].start_s
    return None if last_end is None else start - last_end, clock.t0 + passes[-1].start_s + passes[-1].duration_s


def measure(setup: Setup, engine: str, prompt: str, batch: int, bar: tqdm, checkpoint: str | None) -> list[dict]:
    """Warm up, then record; returns the recorded rows (each written to disk as it finishes)."""
    vocab = setup.model.config.vocab_size  # (the Qwen2.5 tokenizer's ids, for a model of another vocabulary)
    prompts = [[t % vocab for t in p] for p in batch_prompts(prompt, batch, checkpoint)]
    check_fits(setup.model, [len(p) for p in prompts], setup.new_tokens)
    store = RunStore(setup.store_root / STORE_NAMES.get(engine, engine))
    if engine == "continuous":
        from engine.continuous import closed_run
        runner = setup.continuous_runner(batch, max(map(len, prompts)) + setup.new_tokens)
        run = lambda run_id: closed_run(runner, prompts, setup.new_tokens, run_id)  # noqa: E731
        mode = runner.mode_name
    elif engine == "hf":
        if setup.hf is None:
            from engine.hf_baseline import HFBaseline
            setup.hf = HFBaseline(setup.model)
        run = lambda run_id: setup.hf.generate(prompts, setup.new_tokens, run_id)  # noqa: E731
        mode = setup.mode
    else:
        decoder = setup.decoder_factory(setup.model) if setup.decoder_factory and engine != "naive" else None
        run = lambda run_id: generate(setup.model, prompts, setup.new_tokens, engine=engine,  # noqa: E731
                                      run_id=run_id, decoder=decoder)
        # PDL kernels are the batch-1 and small-batch paths'
        pdl = decoder is not None and decoder.fast.pdl and (batch == 1 or decoder.fast.uses_small(batch))
        mode = "eager" if decoder is None else ("graph+pdl" if pdl else "graph")
    rows = []
    for i in range(setup.warmup + setup.runs):
        recorded = i - setup.warmup
        run_id = f"{engine}-{prompt}-b{batch}-r{recorded}-{setup.stamp}"
        gen = run(run_id)
        bar.update(1)
        if engine == "continuous":
            idle, setup.last_pass_end = gpu_idle_before(runner.clock, gen.passes, setup.last_pass_end)
        if recorded < 0:
            continue
        row = run_row(gen, engine, prompt, batch, recorded, setup, run_id, mode)
        if engine == "continuous":
            row["idle_before_s"] = idle
        store.write_run(run_id, gen.passes, gen.request_records(run_id), row)
        rows.append(row)
    return rows


def build_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="python -m engine bench",
        description="Closed-run benchmark of the real engine: warm-ups, then recorded runs, one row per run "
                    "in OUT/<engine>/runs.jsonl and runs.csv, the run's records in OUT/<engine>/<run id>/.")
    p.add_argument("--engine", default="cached",
                   help=f"one of {', '.join(BENCH_ENGINES)} (default cached); hf is Hugging Face transformers' "
                        "static-cache generate on the same weights")
    p.add_argument("--prompts", default=None,
                   help=f"comma-separated prompt names (default on a GPU: all, {GPU_DEFAULTS['prompts']}; "
                        f"on a CPU: {CPU_DEFAULTS['prompts']}); mix: a batch of the five in turn")
    p.add_argument("--batch-size", default="1", help="comma-separated batch sizes, e.g. 1,2,4,...,1024 (default 1)")
    p.add_argument("--model", default=None,
                   help=f"preset name or a Hugging Face config.json (random weights; presets: {', '.join(PRESETS)}), or a "
                        "checkpoint directory (default qwen2.5-1.5b on a GPU, tiny on the CPU)")
    p.add_argument("--dtype", default="float16", help="float16 (default), bfloat16 or float32")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (default)")
    p.add_argument("--new-tokens", type=int, default=None,
                   help=f"tokens generated per run (default {GPU_DEFAULTS['new_tokens']} on a GPU, "
                        f"{CPU_DEFAULTS['new_tokens']} on a CPU)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up runs per configuration (default 2; CPU 1)")
    p.add_argument("--runs", type=int, default=None, help="recorded runs per configuration (default 5; CPU 2)")
    p.add_argument("--gpu-spec", default=None, help=f"roofline GPU preset ({', '.join(GPUS)}); "
                                                      "default: h200 on an H200, a10 on other GPUs")
    p.add_argument("--graphs", choices=("auto", "on", "off"), default="auto",
                   help="replay decode passes as CUDA graphs (auto: on when on a GPU)")
    p.add_argument("--small-batch-max", type=number(int, low=1, high=16), default=None, metavar="N",
                   help="decode batches 2..N on the small-batch fused kernels (engine/kernels/small_m.py; "
                        "at most 16; 1: none, cuBLAS with small kernels between); default 8 at Qwen2.5-1.5B's "
                        "widths, where they measured faster on an H200, else 1 (engine.fast_path.SMALL_MAX)")
    p.add_argument("--seed", type=number(int, low=0, high=SEED_MAX), default=0,
                   help="seed of the random weights (default 0)")
    p.add_argument("--out", default=None, help="results directory (default results/ on a GPU, out/results/ "
                                               "on a CPU)")
    return p


def configure(args) -> tuple:
    """Check every option before any work; returns (device, dtype, prompts, sizes)."""
    if args.engine not in BENCH_ENGINES:
        raise ValueError(f"--engine: unknown engine {args.engine!r}; known: {', '.join(BENCH_ENGINES)}")
    device = resolve_device(args.device)
    defaults = GPU_DEFAULTS if device.type == "cuda" else CPU_DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        prompts = parse_prompts(args.prompts)
    except ValueError as e:
        raise ValueError(f"--prompts: {e}") from None
    sizes = parse_batch_sizes(args.batch_size)
    if args.engine == "cached" and sizes != [1]:
        raise ValueError("--batch-size: the cached engine runs at batch size 1; use --engine batched for larger "
                         "batches")
    if args.new_tokens < 1 or args.runs < 1 or args.warmup < 0:
        raise ValueError("--new-tokens and --runs must be >= 1, --warmup >= 0")
    if args.gpu_spec is not None:
        try:
            get_gpu(args.gpu_spec)
        except ValueError as e:
            raise ValueError(f"--gpu-spec: {e}") from None
    if args.graphs == "on" and device.type != "cuda":
        raise ValueError("--graphs on: CUDA graphs need a CUDA device, and this run is on the CPU")
    return device, parse_dtype(args.dtype), prompts, sizes


def check_memory(model, batch: int, tokens: int, dtype: torch.dtype, device: torch.device) -> None:
    """Refuse a batch whose KV cache and last-position logits alone exceed the device's whole
    memory (a batch that fits the whole memory but not what is free is measured, and recorded as
    out of memory on a GPU)."""
    need = batch * (tokens * model.config.kv_bytes_per_token(torch.finfo(dtype).bits // 8)
                    + model.config.vocab_size * 4)
    total = device_memory(device)
    if need > total:
        raise ValueError(f"--batch-size {batch}: its KV cache and logits alone need {need / GIB:,.1f} GiB, more than "
                         f"the {total / GIB:,.1f} GiB this {device.type} has")


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        device, dtype, prompts, sizes = configure(args)
        source = args.model or ("qwen2.5-1.5b" if device.type == "cuda" else "tiny")
        out_dir = Path(args.out) if args.out else REPO / ("results" if device.type == "cuda" else "out/results")
        check_writable_dir(out_dir)
        model, weights = load_model(source, dtype, device, seed=args.seed)
        for prompt in prompts:  # fail before measuring anything, not halfway through
            try:
                check_fits(model, [longest_prompt(prompt)], args.new_tokens)
            except ValueError as e:
                raise ValueError(f"--prompts {prompt} --new-tokens {args.new_tokens}: {e}") from None
        check_memory(model, max(sizes), max(longest_prompt(p) for p in prompts) + args.new_tokens, dtype, device)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    meta = {"model": model.config.name, "weights": weights, "dtype": str(dtype).removeprefix("torch."),
            "device": device.type, **provenance(device)}
    dtype_bytes = torch.finfo(dtype).bits // 8
    weight_bytes = model.config.weight_bytes_read_per_pass(dtype_bytes)
    use_graphs = (args.graphs == "on" or (args.graphs == "auto" and device.type == "cuda")) and \
        choose_kernels("triton") == "triton"  # the graph decoder runs the triton kernels
    if device.type == "cuda":
        free_gib = torch.cuda.mem_get_info(device)[0] / GIB
        gpu_spec = get_gpu(args.gpu_spec or ("h200" if "H200" in meta["gpu"] else "a10"))
        roof = roofline(model.config, gpu_spec, dtype_bytes, free_gib=free_gib)
        meta |= {"roofline_gpu": gpu_spec.name, "roofline_floor_ms": roof.batch1_floor_ms,
                 "free_gib_after_load": free_gib, "kv_cache_positions": roof.cache_token_positions}
        print(roof.table())
    else:
        meta |= {"roofline_gpu": None, "roofline_floor_ms": None, "free_gib_after_load": None,
                 "kv_cache_positions": None}
        print("device: cpu (no GPU here: a smoke run; no roofline, no bandwidth figures)")
    factory = None
    if use_graphs:
        from engine.cuda_graphs import GraphDecoder
        factory = functools.partial(GraphDecoder, small_max=args.small_batch_max)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%f")[:-3] + "Z"  # to the millisecond
    setup = Setup(model, args.new_tokens, args.warmup, args.runs, meta, weight_bytes, out_dir, stamp, factory,
                  "graph" if use_graphs else "eager")
    if args.engine == "hf":
        setup.mode = "static-cache generate" + (" (compiled)" if device.type == "cuda" else "")
    setup.max_batch = max(sizes)
    setup.small_max = args.small_batch_max
    setup.max_tokens = max(longest_prompt(p) for p in prompts) + args.new_tokens
    print(f"model {source} ({weights} weights, {meta['dtype']}) on {meta['gpu']}, torch {meta['torch']}, "
          f"commit {meta['git_commit']}, decode {setup.mode}; rows go to "
          f"{out_dir / STORE_NAMES.get(args.engine, args.engine)}")
    print(f"{'':>8} {'':>6} {'':<7} {'mean / median over the recorded runs':>40}")
    total = len(prompts) * len(sizes) * (args.warmup + args.runs)
    with tqdm(total=total, desc=f"{args.engine}", unit="run", file=sys.stderr) as bar:
        for prompt in prompts:
            for batch in sizes:
                try:
                    rows = measure(setup, args.engine, prompt, batch, bar, args.model)
                except torch.cuda.OutOfMemoryError as e:
                    torch.cuda.empty_cache()
                    msg = f"CUDA out of memory at batch {batch}, prompt {prompt}: {str(e).splitlines()[0]}"
                    tqdm.write(f"{args.engine:>8} {prompt:>6} B={batch:<5} {msg}")
                    RunStore(out_dir / args.engine).append_row(failure_row(args.engine, prompt, batch, "oom", msg,
                                                                           setup))
                    bar.update(args.warmup + args.runs)
                    continue
                tqdm.write(summarize(rows, setup))
    return 0
