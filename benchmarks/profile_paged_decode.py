"""Where the continuous engine's batched decode pass spends its time, and which attention slicing
it wants (the target "decode batch 64 <= 2.2 ms at p256" of the continuous engine).

1. Passes: the continuous engine's runner (CUDA graphs, paged cache) timed on decode passes of
   `--batches` sequences at contexts of the p256 closed run (256 + 0..255 generated tokens),
   through the same launch path as an open run (`calibrate.sweep.run_sweep`).
2. Against the static engine (`--against-static`, default batches 1,8,64): a pass at 385 cached
   positions built up from its graph alone, replayed back to back, to everything the runner does
   around it (the index arrays' upload, their copies into the graph's buffers, the previous pass's
   tokens taken on the GPU, the pass's two events and its tokens' download), beside the static
   engine's decode graph of the same batch (`engine.cuda_graphs.GraphDecoder`).
3. Breakdown: the batch-64 decode step launched kernel by kernel behind a sleep kernel, a CUDA
   event after each kind of kernel, as `profile_decode.py` does for the static engine.
4. Attention alone: the paged decode-attention kernel over the 28 layers' caches, replayed as a
   CUDA graph, under several slicings (slices a sequence, fewest positions a slice) and tile
   widths, against the dense kernel the static `batched` engine runs, at `--attention-batches`.
5. The whole decode graph under other slicings (`--slicings`), at the `--against-static` batches
   and `--slicing-contexts`.

    python benchmarks/profile_paged_decode.py [--batches 32,56,64,72,128] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_decode import chain_time_us, measured_on  # noqa: E402

from calibrate.sweep import Shape, run_sweep  # noqa: E402
from engine.continuous import ModelRunner  # noqa: E402
from engine.cuda_graphs import GraphDecoder  # noqa: E402
from engine.host_buffers import Downloads, EventPool  # noqa: E402
from engine.kernels.attention import DecodeAttention, PagedDecodeAttention  # noqa: E402
from engine.paged import PagedKVCache  # noqa: E402
from engine.weights import build_random  # noqa: E402

CONTEXTS = (256, 384, 511)


def pass_times(runner: ModelRunner, batches: list[int], repeats: int) -> dict:
    shapes = [Shape(f"decode b{b} c{c}", tuple((c, 1) for _ in range(b))) for b in batches for c in CONTEXTS]
    shapes += [Shape(f"decode b{b} p256", tuple((256 + (7 * i) % 256, 1) for i in range(b))) for b in batches]
    records = run_sweep(runner, shapes, repeats=repeats, run_id="profile")
    by = defaultdict(list)
    for p in records:
        by[(len(p.new_tokens), tuple(p.context_lens))].append(p.duration_s * 1e3)
    out = {}
    for s in shapes:
        key = (len(s.seqs), tuple(c for c, _ in s.seqs))
        out[s.group] = statistics.median(by[key])
    print("\ndecode passes (graph replay through the runner), median ms:")
    for g, ms in out.items():
        print(f"  {g:<22}{ms:8.3f}")
    return out


def fill(runner: ModelRunner, batch: int, context: int, repeats: int = 1) -> None:
    """Run decode passes of `batch` sequences at `context` cached positions through the runner, so
    that the static buffers of their graph hold that batch."""
    run_sweep(runner, [Shape("b", tuple((context, 1) for _ in range(batch)))], repeats=repeats, run_id="fill")


def sliced(slicing: tuple[int, int] | None) -> type:
    """The paged attention with every batch's slicing (slices a sequence, fewest positions a slice)
    set to `slicing`; None: the engine's rule."""
    if slicing is None:
        return PagedDecodeAttention
    return type("Sliced", (PagedDecodeAttention,), {"SLICES": {False: slicing, True: slicing}, "PROGRAMS": None})


def per_call_us(fn, calls: int = 150, rounds: int = 6, reset=None) -> float:
    """Microseconds a call of `fn`, launched `calls` times back to back; the median of `rounds`
    rounds after the first (`reset()` before each round)."""
    out = []
    for _ in range(rounds):
        if reset is not None:
            reset()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(out[1:])


def against_static(runner: ModelRunner, model, batches: list[int], context: int = 384) -> dict:
    """Per batch: the static engine's decode graph, and the continuous engine's pass built up from
    its graph to everything the runner launches around it (us a pass)."""
    fast, events, downloads = runner.fast, EventPool(True), Downloads(runner.max_num_seqs)
    out = {}
    print(f"\ndecode pass at {context + 1} cached positions, us (launched back to back):")
    for b in batches:
        fill(runner, b, context, repeats=3)
        graph = fast.graphs[fast.bucket(b)]
        width = -(-(context + 1) // runner.cache.block_size)
        arrays = [np.zeros(b, np.int64), np.full(b, context, np.int64),
                  np.arange(b, dtype=np.int64) * runner.cache.block_size * width, np.full(b, context + 1, np.int64),
                  np.arange(b * width, dtype=np.int64)]
        index = np.concatenate([np.arange(b), np.arange(b)]).astype(np.int64)
        previous = fast.s_out.clone()

        def stage(take: bool) -> None:  # replay_decode's steps before its replay
            tokens, positions, slots, lens, tables, where = fast.stage(arrays + [index if take else index[:0]])
            fast.s_tokens[:b].copy_(tokens)
            fast.s_positions[:b].copy_(positions)
            fast.s_slots[:b].copy_(slots)
            fast.s_lens[:b].copy_(lens)
            fast.s_tables[:b, :width].copy_(tables.view(b, width))
            if take:
                fast.take_previous(fast.s_tokens, where, previous)

        def whole() -> None:  # and ModelRunner.launch's around it
            start = events.record()
            stage(True)
            sampled = graph()
            end = events.record()
            buffer, done = downloads.start(sampled[:b])
            downloads.give_back(buffer, done)
            events.release(start, end)

        decoder = GraphDecoder(model)
        decoder.cache(b, 512)

        def from_284() -> None:  # each round's 150 steps go from 284 to 434 cached positions, inside the 512
            decoder.start(torch.zeros(b, dtype=torch.long, device="cuda"), torch.full((b,), context - 100, device="cuda"))

        row = {"static engine's graph": per_call_us(decoder.step, reset=from_284),
               "graph": per_call_us(graph),
               "+ upload": per_call_us(lambda: (fast.stage(arrays), graph())),
               "+ copies into its buffers": per_call_us(lambda: (stage(False), graph())),
               "+ previous tokens taken": per_call_us(lambda: (stage(True), graph())),
               "+ events and download (the pass)": per_call_us(whole)}
        out[b] = row
        print(f"  batch {b}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()))
    return out


def breakdown(runner: ModelRunner, batch: int, context: int) -> dict:
    """Each kind of kernel's share of one decode step of `batch` sequences, launched one by one."""
    fill(runner, batch, context)
    fast = runner.fast
    b = fast.bucket(batch)
    fast.decode_step(b)
    torch.cuda.synchronize()
    fast.fast.trace = []
    torch.cuda._sleep(int(3e8))
    fast.fast._mark("start")
    fast.decode_step(b)
    torch.cuda.synchronize()
    marks, fast.fast.trace = fast.fast.trace, None
    share = defaultdict(float)
    for (_, a), (label, e) in zip(marks, marks[1:]):
        share[label] += a.elapsed_time(e)
    total = sum(share.values())
    print(f"\nbatch {batch} at context {context}, launched kernel by kernel: {total:.3f} ms")
    for label, ms in sorted(share.items(), key=lambda kv: -kv[1]):
        print(f"  {label:<22}{ms:8.3f} ms  {100 * ms / total:5.1f}%")
    return dict(share)


def attention_variants(model, cache: PagedKVCache, batches: list[int]) -> list[dict]:
    return [r | {"batch": b} for b in batches for r in attention_at(model, cache, b)]


def attention_at(model, cache: PagedKVCache, batch: int) -> list[dict]:
    c = model.config
    heads, kvh, D, L = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.num_hidden_layers
    bs = cache.block_size
    rows = []
    variants = [("engine", None, None, 64), ("small slicing (64, 128)", False, (64, 128), 64),
                ("slices of >= 256", False, (64, 256), 64), ("big slicing (16, 1024)", True, (16, 1024), 64),
                ("big, tiles of 32", True, (16, 1024), 32), ("big, tiles of 128", True, (16, 1024), 128),
                ("small, tiles of 32", False, (64, 128), 32)]
    for context in CONTEXTS:
        width = -(-(context + 1) // bs)
        tables = torch.arange(batch * width, dtype=torch.int32, device="cuda").view(batch, width)
        lens = torch.full((batch,), context + 1, dtype=torch.int32, device="cuda")
        q = torch.randn(batch, heads, D, dtype=torch.float16, device="cuda")
        out = torch.empty(batch, heads * D, dtype=torch.float16, device="cuda")
        for name, big, slicing, block_n in variants:
            attn = sliced(slicing)(batch, heads, kvh, D, 4096, bs, "cuda", block_n=block_n)
            us = chain_time_us([lambda i=i: attn(q, cache.k[i], cache.v[i], tables, lens, out, batch=batch)
                                for i in range(L)])
            rows.append({"variant": name, "context": context, "us_per_layer": us})
        dense_k = [torch.randn(batch, kvh, 512, D, dtype=torch.float16, device="cuda") for _ in range(L)]
        dense_v = [torch.randn_like(k) for k in dense_k]
        dense = DecodeAttention(batch, heads, kvh, D, 512, "cuda")  # as `batched` sizes it for p256 + 256
        pos = torch.full((batch,), context, device="cuda")
        us = chain_time_us([lambda i=i: dense(q, dense_k[i], dense_v[i], pos, out) for i in range(L)])
        rows.append({"variant": "dense (batched engine)", "context": context, "us_per_layer": us})
    print(f"\ndecode attention at batch {batch}, us per layer (x{L} per pass):")
    names = list(dict.fromkeys(r["variant"] for r in rows))
    print(f"  {'variant':<26}" + "".join(f"{'c' + str(c):>9}" for c in CONTEXTS))
    for n in names:
        print(f"  {n:<26}" + "".join(f"{r['us_per_layer']:9.2f}" for r in rows if r["variant"] == n))
    return rows


GRAPH_SLICINGS = "64x128,16x128,4x128"  # 64x128: the rule before 2026-12-04


def graph_slicings(runner: ModelRunner, batches: list[int], contexts: list[int], slicings: list[tuple[int, int]]) -> list:
    """Per batch and context: the continuous engine's decode graph alone (us a replay), recaptured
    with its attention's slicing (at most so many slices a context, none shorter than so many
    positions) set to each of `slicings` beside the engine's rule. Fewer slices launch fewer
    programs that exit at once on short contexts, and fewer to read long ones: what that costs
    inside a graph of kernels chained by programmatic dependent launch, which a kernel timed
    alone does not show."""
    from engine.cuda_graphs import _Graph
    fast = runner.fast
    rows = []
    variants = [("engine", None)] + [(f"{n}x{m}", (n, m)) for n, m in slicings]
    print("\ncontinuous decode graph by slicing (slices x fewest positions a slice), us a replay:")
    print(f"  {'batch':>5} {'cached':>7} " + "".join(f"{label:>10}" for label, _ in variants))
    for b in batches:
        name = "attention_b1" if b == 1 else "attention_small" if fast.fast.uses_small(b) else "attention"
        engine_attention, bucket = getattr(fast, name), fast.bucket(b)
        engine_graph = fast.graphs[bucket]
        a = engine_attention
        try:
            for context in contexts:
                row = {"batch": b, "cached": context + 1}
                for label, slicing in variants:
                    setattr(fast, name, sliced(slicing)(a.max_batch, a.heads, a.kv_heads, a.head_dim, a.context,
                                                        a.block_size, runner.device, pdl=a.pdl))
                    fast.graphs[bucket] = _Graph(lambda: fast.decode_step(bucket), fast.mode == "graph")
                    fill(runner, b, context, repeats=2)
                    row[label] = per_call_us(fast.graphs[bucket], calls=60, rounds=5)
                rows.append(row)
                print(f"  {b:>5} {context + 1:>7} " + "".join(f"{row[label]:10.1f}" for label, _ in variants), flush=True)
        finally:
            setattr(fast, name, engine_attention)
            fast.graphs[bucket] = engine_graph
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="32,56,64,72,128")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--against-static", default="1,8,64", help="batches of part 2 (empty: none)")
    ap.add_argument("--attention-batches", default="64", help="batches of part 4")
    ap.add_argument("--slicing-contexts", default="384", help="cached positions (less the new token) of part 5")
    ap.add_argument("--slicings", default=GRAPH_SLICINGS,
                    help="part 5's slicings beside the engine's: SLICESxFEWEST, comma-separated")
    ap.add_argument("--parts", default="1,2,3,4,5", help="which parts to run")
    ap.add_argument("--model", default="qwen2.5-1.5b", help="a preset or a config.json (random weights)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("profile_paged_decode.py times CUDA graphs: it needs a CUDA GPU (torch.cuda.is_available() is False)")
    batches = [int(b) for b in args.batches.split(",")]
    static_batches = [int(b) for b in args.against_static.split(",") if b.strip()]
    attention_batches = [int(b) for b in args.attention_batches.split(",") if b.strip()]
    slicing_contexts = [int(c) for c in args.slicing_contexts.split(",")]
    slicings = [tuple(int(v) for v in s.split("x")) for s in args.slicings.split(",") if s.strip()]
    parts = {int(p) for p in args.parts.split(",")}
    model = build_random(args.model, dtype="float16", device="cuda")
    blocks = max(max(batches) * 40, max(static_batches, default=1) * -(-(max(slicing_contexts) + 2) // 16)) + 64
    cache = PagedKVCache(model.config, blocks, 16, torch.float16, "cuda")
    runner = ModelRunner(model, cache, max(256, max(batches)), "triton", graphs=True)
    result = {"measured_on": measured_on(), "model": args.model}
    for number, (name, part) in enumerate((
            ("passes_ms", lambda: pass_times(runner, batches, args.repeats)),
            ("against_static_us", lambda: against_static(runner, model, static_batches)),
            ("breakdown_ms", lambda: breakdown(runner, 64, 384)),
            ("attention", lambda: attention_variants(model, cache, attention_batches)),
            ("graph_slicings_us", lambda: graph_slicings(runner, static_batches, slicing_contexts, slicings))), 1):
        if number not in parts:
            continue
        try:
            result[name] = part()
        except Exception as e:  # report and go on: one failing part should not hide the others
            print(f"{name}: failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
