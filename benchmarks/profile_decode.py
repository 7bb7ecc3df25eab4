"""Where a decode step's time goes on a GPU, and which tile sizes the batch-1 kernels want.

1. Tiles: each batch-1 kernel (engine.kernels.gemv) is timed as a chain of 28 launches, one per
   layer on its own weights (so L2 does not flatter the smaller matrices), replayed as a CUDA
   graph, for several (rows, tile width, warps); the best of each is kept.
2. Steps: the real model's decode step, captured by GraphDecoder with those tiles, is timed by
   graph replay at batch 1 and at larger batches; then the same step is launched once with a CUDA
   event after every kernel, behind a long sleep kernel so the host's launches run ahead of the
   GPU, giving each kind of kernel's share of the step.

    python benchmarks/profile_decode.py [--json OUT.json] [--batches 1,64,256]
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch
import triton.testing

from core.config import get_preset
from engine.cuda_graphs import GraphDecoder
from engine.kernels import gemv as G
from engine.kernels.attention import DecodeAttention
from engine.model import DenseKVCache
from engine.prompts import prompt_ids
from engine.weights import build_random

COPY_GBS = 4150.0  # measured device-to-device copy bandwidth of the H200 (2026-11-29)


def chain_time_us(fns) -> float:
    """Median microseconds per launch of a list of launches replayed as one CUDA graph."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    return triton.testing.do_bench(g.replay, warmup=25, rep=100, return_mode="median") * 1e3 / len(fns)


def tune_b1_tiles(cache_len: int, context: int) -> tuple[dict, list]:
    c = get_preset("qwen2.5-1.5b")
    dev, dt, L = "cuda", torch.float16, c.num_hidden_layers
    H, I, D, heads, kvh = c.hidden_size, c.intermediate_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads
    qkv_n = (heads + 2 * kvh) * D
    r = lambda *s: torch.randn(*s, dtype=dt, device=dev) * 0.02  # noqa: E731
    w_qkv, b_qkv, w_o = [r(qkv_n, H) for _ in range(L)], [r(qkv_n) for _ in range(L)], [r(H, H) for _ in range(L)]
    w_gu, w_down, emb = [r(2 * I, H) for _ in range(L)], [r(H, I) for _ in range(L)], r(c.vocab_size, H)
    norm = torch.ones(H, dtype=dt, device=dev)
    h, act, q, attn_out = r(H), r(I), r(heads * D), r(heads * D)
    logits = torch.empty(c.vocab_size, dtype=dt, device=dev)
    cache = DenseKVCache(c, 1, cache_len, dt, dev)
    for t in cache.k + cache.v:
        t.normal_()
    cos, sin = torch.randn(cache_len, D, dtype=dt, device=dev), torch.randn(cache_len, D, dtype=dt, device=dev)
    pos = torch.tensor([context - 1], device=dev)
    attn = DecodeAttention(1, heads, kvh, D, cache_len, dev)
    grid = lambda rs, bks, ws: [(R, BK, W) for R in rs for BK in bks for W in ws]  # noqa: E731
    candidates = {
        "qkv": (grid((2, 4), (256, 512), (2, 4, 8)), 2 * qkv_n * H,
                lambda t: [lambda i=i: G.qkv_rope_cache(w_qkv[i], b_qkv[i], h, norm, 1e-6, pos, cos, sin, q,
                                                        cache.k[i], cache.v[i], heads, kvh, *t) for i in range(L)]),
        "o": (grid((4, 8), (512, 2048), (4, 8)), 2 * H * H,
              lambda t: [lambda i=i: G.gemv(w_o[i], attn_out, h, residual=h, rows=t[0], block_k=t[1], warps=t[2])
                         for i in range(L)]),
        "gate_up": (grid((2, 4, 8), (256, 512), (4, 8)), 2 * 2 * I * H,
                    lambda t: [lambda i=i: G.gate_up_silu(w_gu[i], h, norm, 1e-6, act, *t) for i in range(L)]),
        "down": (grid((1, 2), (2048, 4096, 8192), (4, 8, 16)), 2 * H * I,
                 lambda t: [lambda i=i: G.gemv(w_down[i], act, h, residual=h, rows=t[0], block_k=t[1], warps=t[2])
                            for i in range(L)]),
        "lm_head": (grid((8, 16, 32), (512,), (4, 8)), 2 * c.vocab_size * H,
                    lambda t: [lambda: G.gemv(emb, h, logits, norm_weight=norm, rows=t[0], block_k=t[1], warps=t[2])]),
    }
    best, table = {}, []
    for name, (tiles, nbytes, make) in candidates.items():
        timings = []
        for t in tiles:
            try:
                timings.append((chain_time_us(make(t)), t))
            except Exception as e:  # a tile that does not compile or fit is skipped, and said so
                print(f"{name} {t}: skipped ({type(e).__name__}: {str(e).splitlines()[0][:80]})")
        timings.sort()
        best[name] = timings[0][1]
        table.append((name, timings[0][1], timings[0][0], nbytes / timings[0][0] / 1e3, timings[1:4]))
    attn_us = chain_time_us([lambda i=i: attn(q, cache.k[i], cache.v[i], pos, attn_out) for i in range(L)])
    tiles = {k: tuple(v) for k, v in best.items()}
    print(f"\nbatch-1 kernels, per launch (graph replay of {L} launches on distinct weights), "
          f"cache {cache_len}, context {context}")
    print(f"{'kernel':<10}{'best tiles':<16}{'us':>8}{'GB/s':>9}   next best (us)")
    for name, t, us, gbs, others in table:
        print(f"{name:<10}{str(t):<16}{us:>8.2f}{gbs:>9.0f}   " + " ".join(f"{tt}:{u:.1f}" for u, tt in others))
    print(f"{'attention':<26}{attn_us:>8.2f}")
    table.append(("attention", (), attn_us, 0.0, []))
    return tiles, table


def step_profile(model, batch: int, tiles: dict | None, pdl: bool = False, prompt: str = "p256",
                 new_tokens: int = 256) -> dict:
    """Graph-replay time of one decode step, and each kernel kind's share of an instrumented step."""
    ids = prompt_ids(prompt)
    dec = GraphDecoder(model, True, tiles, pdl=pdl)
    cache = dec.cache(batch, len(ids) + new_tokens)
    first = dec.prefill(torch.tensor([ids] * batch, device="cuda")).clone()
    middle = len(ids) + new_tokens // 2  # mid-way through the output
    pos = torch.full((batch,), middle, device="cuda")
    dec.start(first, pos)

    def one_step():  # back to the same position each time (one small fill kernel more than a real step)
        dec.positions.fill_(middle)
        dec.step()

    step_ms = triton.testing.do_bench(one_step, warmup=20, rep=200, return_mode="median")
    fast = dec.fast
    if batch == 1:
        attend = lambda i, q, out: dec.attention(q, cache.k[i], cache.v[i], pos, out)  # noqa: E731
        run = lambda: fast.decode_b1(first, pos, cache.k, cache.v, attend)  # noqa: E731
    else:
        run = lambda: fast.decode(first, pos, cache, dec.attention)  # noqa: E731
    run()
    torch.cuda.synchronize()
    fast.trace = []
    torch.cuda._sleep(int(3e8))  # the GPU waits while the host queues the whole step
    fast._mark("start")
    run()
    torch.cuda.synchronize()
    marks, fast.trace = fast.trace, None
    share = defaultdict(float)
    for (_, a), (label, b) in zip(marks, marks[1:]):
        share[label] += a.elapsed_time(b)
    instrumented = sum(share.values())
    print(f"\nbatch {batch}{' with PDL' if pdl else ''}: graph replay {step_ms:.3f} ms/step = {batch / step_ms * 1e3:,.0f} tok/s; "
          f"instrumented launch {instrumented:.3f} ms")
    for label, ms in sorted(share.items(), key=lambda kv: -kv[1]):
        print(f"  {label:<22}{ms:8.3f} ms  {100 * ms / instrumented:5.1f}%")
    return {"batch": batch, "pdl": pdl, "graph_step_ms": step_ms, "instrumented_ms": instrumented,
            "share_ms": dict(share)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write tiles and breakdowns here")
    ap.add_argument("--batches", default="1,64,256", help="batch sizes for the step breakdown")
    ap.add_argument("--no-tune", action="store_true", help="skip the tile sweep; use the engine's tiles")
    ap.add_argument("--pdl", choices=("off", "on", "both"), default="off",
                    help="programmatic dependent launch on the batch-1 kernels")
    args = ap.parse_args()
    tiles, table = (None, []) if args.no_tune else tune_b1_tiles(cache_len=512, context=384)
    model = build_random("qwen2.5-1.5b", dtype="float16", device="cuda")
    floor_ms = model.config.weight_bytes_read_per_pass() / (COPY_GBS * 1e9) * 1e3
    print(f"\nweight-read floor of one step: {floor_ms:.3f} ms at {COPY_GBS:.0f} GB/s; tiles {tiles or 'default'}")
    pdls = {"off": [False], "on": [True], "both": [False, True]}[args.pdl]
    steps = []
    for b in args.batches.split(","):
        for pdl in (pdls if b == "1" else [False]):
            try:
                steps.append(step_profile(model, int(b), tiles, pdl))
            except Exception as e:  # report and go on: one failing variant should not hide the rest
                print(f"batch {b} pdl={pdl}: failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tiles": tiles, "floor_ms": floor_ms, "steps": steps,
                       "kernels": [{"name": n, "tiles": t, "us": us, "gb_s": g} for n, t, us, g, _ in table]},
                      f, indent=1)


if __name__ == "__main__":
    main()
