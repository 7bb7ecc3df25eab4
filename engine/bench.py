"""The benchmark harness for closed runs: 2 warm-up + 5 recorded runs per (engine, prompt, batch).

Each recorded run becomes one row of `results/<engine>/runs.jsonl` and `runs.csv` (TTFT, ITL mean
and per token, decode tok/s, total time, and where it ran), written and flushed as soon as the run
ends; its passes go to `passes.jsonl.gz`. After each configuration a summary line prints the mean
and median over the recorded runs and the memory bandwidth the decode achieved.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from engine.engines import ENGINES, Generation, check_fits, generate
from engine.prompts import PROMPT_LENGTHS, parse_prompts, prompt_ids
from engine.provenance import provenance, resolve_device
from engine.roofline import GIB, GPUS, get_gpu, roofline
from engine.weights import load_model, parse_dtype
from sim.records import RowWriter, to_dict


BENCH_ENGINES = ENGINES + ("hf",)


def parse_batch_sizes(spec: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; every size must be a positive integer."""
    sizes = []
    for part in spec.split(","):
        part = part.strip()
        try:
            size = int(part)
        except ValueError:
            raise ValueError(f"batch size {part!r} is not an integer") from None
        if size <= 0:
            raise ValueError(f"batch size must be >= 1, got {size}")
        sizes.append(size)
    if not sizes:
        raise ValueError("no batch size given")
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
    decoder_factory: object = None  # callable(model) -> decoder for the CUDA-graph path, or None
    mode: str = "eager"
    hf: object = None               # the Hugging Face baseline, built on first use


RUN_FIELDS = ("engine", "mode", "prompt", "prompt_tokens", "batch_size", "new_tokens", "run", "status",
              "ttft_ms", "itl_mean_ms", "itl_ms", "decode_tok_s", "total_s", "weight_gb_s", "error", "run_id")


def _row(setup: Setup, **fields) -> dict:
    """A result row with every column present (None where it does not apply), then provenance."""
    return {k: fields.get(k) for k in RUN_FIELDS} | setup.meta


def run_row(gen: Generation, engine: str, prompt: str, batch: int, index: int, setup: Setup,
            run_id: str, mode: str) -> dict:
    """One recorded run as a result row."""
    t = gen.step_times_s
    itls = [b - a for a, b in zip(t, t[1:])]
    itl_mean = statistics.fmean(itls) if itls else float("nan")
    decode_s = t[-1] - t[0]
    return _row(
        setup, engine=engine, mode=mode, prompt=prompt, prompt_tokens=gen.prompt_lens[0],
        batch_size=batch, new_tokens=len(t), run=index, status="ok",
        ttft_ms=t[0] * 1e3, itl_mean_ms=itl_mean * 1e3, itl_ms=[x * 1e3 for x in itls],
        decode_tok_s=batch * len(itls) / decode_s if decode_s > 0 else float("nan"),
        total_s=t[-1], weight_gb_s=setup.weight_bytes / itl_mean / 1e9 if itls else float("nan"),
        run_id=run_id)


def failure_row(engine: str, prompt: str, batch: int, status: str, error: str, setup: Setup) -> dict:
    return _row(setup, engine=engine, mode=setup.mode, prompt=prompt, prompt_tokens=PROMPT_LENGTHS[prompt],
                batch_size=batch, new_tokens=setup.new_tokens, status=status, error=error)


def summarize(rows: list[dict], setup: Setup) -> str:
    """Mean and median over the recorded runs, with the bandwidth decode achieved."""
    def mm(key: str) -> tuple[float, float]:
        values = [r[key] for r in rows]
        return statistics.fmean(values), statistics.median(values)

    r0 = rows[0]
    ttft, itl, tok = mm("ttft_ms"), mm("itl_mean_ms"), mm("decode_tok_s")
    floor_ms = setup.meta["roofline_floor_ms"]
    gbs = setup.weight_bytes / (itl[1] / 1e3) / 1e9
    return (f"{r0['engine']:>8} {r0['prompt']:>6} B={r0['batch_size']:<5} TTFT {ttft[0]:8.2f} / {ttft[1]:8.2f} ms  "
            f"ITL {itl[0]:7.3f} / {itl[1]:7.3f} ms  {tok[0]:10.1f} / {tok[1]:10.1f} tok/s  "
            f"weights {gbs:7.1f} GB/s ({100 * floor_ms / itl[1]:5.1f}% of the {floor_ms:.3f} ms floor)")


def measure(setup: Setup, engine: str, prompt: str, batch: int, out_dir: Path, bar: tqdm,
            checkpoint: str | None) -> list[dict]:
    """Warm up, then record; returns the recorded rows (also written to disk as they finish)."""
    ids = prompt_ids(prompt, checkpoint)
    check_fits(setup.model, [len(ids)], setup.new_tokens)
    prompts = [ids] * batch
    runs_out = RowWriter(out_dir / engine / "runs.jsonl", out_dir / engine / "runs.csv")
    passes_out = RowWriter(out_dir / engine / "passes.jsonl.gz")
    if engine == "hf":
        if setup.hf is None:
            from engine.hf_baseline import HFBaseline
            setup.hf = HFBaseline(setup.model)
        run = lambda run_id: setup.hf.generate(prompts, setup.new_tokens, run_id)  # noqa: E731
        mode = setup.mode
    else:
        decoder = setup.decoder_factory(setup.model) if setup.decoder_factory and engine != "naive" else None
        run = lambda run_id: generate(setup.model, prompts, setup.new_tokens, engine=engine,  # noqa: E731
                                      run_id=run_id, decoder=decoder)
        pdl = decoder is not None and decoder.fast.pdl and batch == 1  # PDL kernels are the batch-1 path's
        mode = "eager" if decoder is None else ("graph+pdl" if pdl else "graph")
    rows = []
    try:
        for i in range(setup.warmup + setup.runs):
            recorded = i - setup.warmup
            run_id = f"{engine}-{prompt}-b{batch}-r{recorded}-{setup.meta['time']}"
            gen = run(run_id)
            bar.update(1)
            if recorded < 0:
                continue
            row = run_row(gen, engine, prompt, batch, recorded, setup, run_id, mode)
            passes_out.write_many(to_dict(p) for p in gen.passes)
            runs_out.write(row)
            rows.append(row)
    finally:
        runs_out.close()
        passes_out.close()
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m engine bench",
        description="Closed-run benchmark of the real engine: warm-ups, then recorded runs, one row per run "
                    "in RESULTS/<engine>/runs.jsonl and runs.csv.")
    p.add_argument("--engine", default="cached",
                   help=f"one of {', '.join(BENCH_ENGINES)} (default cached); hf is Hugging Face transformers' "
                        "static-cache generate on the same weights")
    p.add_argument("--prompts", default=",".join(PROMPT_LENGTHS),
                   help="comma-separated prompt names (default all: p16,p64,p256,p1024,p4096)")
    p.add_argument("--batch-size", default="1", help="comma-separated batch sizes, e.g. 1,2,4,...,1024 (default 1)")
    p.add_argument("--model", default=None,
                   help="preset name (random weights: qwen2.5-1.5b, tiny) or a Hugging Face checkpoint "
                        "directory (default qwen2.5-1.5b on a GPU, tiny on the CPU)")
    p.add_argument("--dtype", default="float16", help="float16 (default), bfloat16 or float32")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (default)")
    p.add_argument("--new-tokens", type=int, default=256, help="tokens generated per run (default 256)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up runs per configuration (default 2)")
    p.add_argument("--runs", type=int, default=5, help="recorded runs per configuration (default 5)")
    p.add_argument("--gpu-spec", default=None, help=f"roofline GPU preset ({', '.join(GPUS)}); "
                                                      "default: h200 on an H200, a10 otherwise")
    p.add_argument("--graphs", choices=("auto", "on", "off"), default="auto",
                   help="replay decode passes as CUDA graphs (auto: on when on a GPU)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    p.add_argument("--out", default="results", help="results directory (default results/)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.engine not in BENCH_ENGINES:
            raise ValueError(f"unknown engine {args.engine!r}; known: {', '.join(BENCH_ENGINES)}")
        prompts = parse_prompts(args.prompts)
        sizes = parse_batch_sizes(args.batch_size)
        if args.engine == "cached" and sizes != [1]:
            raise ValueError("the cached engine runs at batch size 1; use --engine batched for larger batches")
        if args.new_tokens < 1 or args.runs < 1 or args.warmup < 0:
            raise ValueError("--new-tokens and --runs must be >= 1, --warmup >= 0")
        device = resolve_device(args.device)
        dtype = parse_dtype(args.dtype)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    source = args.model or ("qwen2.5-1.5b" if device.type == "cuda" else "tiny")
    model, weights = load_model(source, dtype, device, seed=args.seed)
    for prompt in prompts:  # fail before measuring anything, not halfway through
        try:
            check_fits(model, [PROMPT_LENGTHS[prompt]], args.new_tokens)
        except ValueError as e:
            print(f"error: {prompt}: {e}", file=sys.stderr)
            return 2
    free_gib = torch.cuda.mem_get_info(device)[0] / GIB if device.type == "cuda" else None
    gpu_spec = get_gpu(args.gpu_spec or ("h200" if "H200" in provenance(device)["gpu"] else "a10"))
    dtype_bytes = torch.finfo(dtype).bits // 8
    roof = roofline(model.config, gpu_spec, dtype_bytes, free_gib=free_gib)
    use_graphs = args.graphs == "on" or (args.graphs == "auto" and device.type == "cuda")
    factory = None
    if use_graphs:
        from engine.cuda_graphs import GraphDecoder
        factory = GraphDecoder

    meta = {"model": model.config.name, "weights": weights, "dtype": str(dtype).removeprefix("torch."),
            "device": device.type, **provenance(device), "roofline_gpu": gpu_spec.name,
            "roofline_floor_ms": roof.batch1_floor_ms, "free_gib_after_load": free_gib,
            "kv_cache_positions": roof.cache_token_positions}
    setup = Setup(model, args.new_tokens, args.warmup, args.runs, meta,
                  roof.weight_bytes, factory, "graph" if use_graphs else "eager")
    if args.engine == "hf":
        setup.mode = "static-cache generate" + (" (compiled)" if device.type == "cuda" else "")
    print(roof.table())
    print(f"model {source} ({weights} weights, {meta['dtype']}) on {meta['gpu']}, torch {meta['torch']}, "
          f"commit {meta['git_commit']}, decode {setup.mode}")
    out_dir = Path(args.out)
    total = len(prompts) * len(sizes) * (args.warmup + args.runs)
    with tqdm(total=total, desc=f"{args.engine}", unit="run", file=sys.stderr) as bar:
        for prompt in prompts:
            for batch in sizes:
                try:
                    rows = measure(setup, args.engine, prompt, batch, out_dir, bar, args.model)
                except torch.cuda.OutOfMemoryError as e:
                    torch.cuda.empty_cache()
                    msg = f"CUDA out of memory at batch {batch}, prompt {prompt}: {str(e).splitlines()[0]}"
                    tqdm.write(f"{args.engine:>8} {prompt:>6} B={batch:<5} {msg}")
                    with RowWriter(out_dir / args.engine / "runs.jsonl", out_dir / args.engine / "runs.csv") as w:
                        w.write(failure_row(args.engine, prompt, batch, "oom", msg, setup))
                    bar.update(args.warmup + args.runs)
                    continue
                tqdm.write(summarize(rows, setup))
    return 0
