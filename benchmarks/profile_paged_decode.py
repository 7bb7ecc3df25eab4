"""Where the continuous engine's batched decode pass spends its time, and which attention slicing
it wants (the target "decode batch 64 <= 2.2 ms at p256" of the continuous engine).

1. Passes: the continuous engine's runner (CUDA graphs, paged cache) timed on decode passes of
   `--batches` sequences at contexts of the p256 closed run (256 + 0..255 generated tokens),
   through the same launch path as an open run (`calibrate.sweep.run_sweep`).
2. Breakdown: the batch-64 decode step launched kernel by kernel behind a sleep kernel, a CUDA
   event after each kind of kernel, as `profile_decode.py` does for the static engine.
3. Attention alone: the paged decode-attention kernel over the 28 layers' caches, replayed as a
   CUDA graph, under several slicings (slices a sequence, fewest positions a slice) and tile
   widths, against the dense kernel the static `batched` engine runs.

    python benchmarks/profile_paged_decode.py [--batches 32,56,64,72,128] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_decode import chain_time_us  # noqa: E402

from calibrate.sweep import Shape, run_sweep  # noqa: E402
from engine.continuous import ModelRunner  # noqa: E402
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


def breakdown(runner: ModelRunner, batch: int, context: int) -> dict:
    """Each kind of kernel's share of one decode step of `batch` sequences, launched one by one."""
    shape = Shape("b", tuple((context, 1) for _ in range(batch)))
    run_sweep(runner, [shape], repeats=1, run_id="fill")  # fills the static buffers for this batch
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


def attention_variants(model, cache: PagedKVCache, batch: int) -> list[dict]:
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
            kind = PagedDecodeAttention if slicing is None else \
                type("Sliced", (PagedDecodeAttention,), {"SLICES": {False: slicing, True: slicing}})
            attn = kind(batch, heads, kvh, D, 4096, bs, "cuda", block_n=block_n)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="32,56,64,72,128")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    model = build_random("qwen2.5-1.5b", dtype="float16", device="cuda")
    blocks = max(batches) * 40 + 64
    cache = PagedKVCache(model.config, blocks, 16, torch.float16, "cuda")
    runner = ModelRunner(model, cache, max(256, max(batches)), "triton", graphs=True)
    result = {}
    for name, part in (("passes_ms", lambda: pass_times(runner, batches, args.repeats)),
                       ("breakdown_ms", lambda: breakdown(runner, 64, 384)),
                       ("attention", lambda: attention_variants(model, cache, 64))):
        try:
            result[name] = part()
        except Exception as e:  # report and go on: one failing part should not hide the others
            print(f"{name}: failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
