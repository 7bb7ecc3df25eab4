"""Where a batch-1 decode step's time goes on a GPU, and which tile sizes the fused kernels want.

For each kernel of the batch-1 step (engine.kernels.gemv, the attention) it times a chain of 28
launches (one per layer, each on its own weights as in the real step, so L2 does not flatter the
smaller matrices) replayed as a CUDA graph, for several tile sizes, and prints the per-launch
time, the bandwidth it reaches and the best tiles. Then it times the whole captured step and
compares it with the sum of its parts: the difference is what launches and gaps cost.

    python benchmarks/profile_decode_b1.py [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json

import torch
import triton.testing

from engine.config import get_preset
from engine.kernels import gemv as G
from engine.kernels.attention import DecodeAttention
from engine.model import KVCache

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
    ms = triton.testing.do_bench(g.replay, warmup=50, rep=300, return_mode="median")
    return ms * 1e3 / len(fns)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the best tiles here")
    ap.add_argument("--context", type=int, default=384, help="live context of the attention (default 384)")
    args = ap.parse_args()
    c = get_preset("qwen2.5-1.5b")
    dev, dt, L = "cuda", torch.float16, c.num_hidden_layers
    H, I, D, heads, kvh = c.hidden_size, c.intermediate_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads
    qkv_n = (heads + 2 * kvh) * D
    r = lambda *s: torch.randn(*s, dtype=dt, device=dev) * 0.02  # noqa: E731
    w_qkv, b_qkv, w_o = [r(qkv_n, H) for _ in range(L)], [r(qkv_n) for _ in range(L)], [r(H, H) for _ in range(L)]
    w_gu, w_down, emb = [r(2 * I, H) for _ in range(L)], [r(H, I) for _ in range(L)], r(c.vocab_size, H)
    norm = torch.ones(H, dtype=dt, device=dev)
    h, act, q = r(H), r(I), r(heads * D)
    logits = torch.empty(c.vocab_size, dtype=dt, device=dev)
    cache = KVCache(c, 1, 4352, dt, dev)
    for t in cache.k + cache.v:
        t.normal_()
    cos = torch.randn(4352, D, dtype=dt, device=dev)
    sin = torch.randn(4352, D, dtype=dt, device=dev)
    pos = torch.tensor([args.context - 1], device=dev)
    lens = pos + 1
    attn = DecodeAttention(1, heads, kvh, D, 4352, dev)

    candidates = {
        "qkv": ([(R, BK) for R in (4, 8, 16, 32) for BK in (256, 512)], 2 * qkv_n * H,
                lambda t: [lambda i=i: G.qkv_rope_cache(w_qkv[i], b_qkv[i], h, norm, 1e-6, pos, cos, sin, q, cache.k[i],
                                                        cache.v[i], heads, kvh, *t) for i in range(L)]),
        "o": ([(R,) for R in (2, 4, 8, 16)], 2 * H * H,
              lambda t: [lambda i=i: G.o_proj_residual(w_o[i], attn, h, *t) for i in range(L)]),
        "gate_up": ([(R, BK) for R in (4, 8, 16, 32) for BK in (256, 512)], 2 * 2 * I * H,
                    lambda t: [lambda i=i: G.gate_up_silu(w_gu[i], h, norm, 1e-6, act, *t) for i in range(L)]),
        "down": ([(R, BK) for R in (2, 4, 8, 16) for BK in (256, 512, 1024)], 2 * H * I,
                 lambda t: [lambda i=i: G.gemv(w_down[i], act, h, residual=h, rows=t[0], block_k=t[1]) for i in range(L)]),
        "lm_head": ([(R, BK) for R in (8, 16, 32, 64) for BK in (256, 512)], 2 * c.vocab_size * H,
                    lambda t: [lambda: G.gemv(emb, h, logits, norm_weight=norm, rows=t[0], block_k=t[1])]),
    }
    attn.partials(q.view(1, heads, D), cache.k[0], cache.v[0], lens)  # o_proj reads the slices
    best, rows = {}, []
    for name, (tiles, nbytes, make) in candidates.items():
        timings = []
        for t in tiles:
            try:
                timings.append((chain_time_us(make(t)), t))
            except Exception as e:  # a tile that does not compile or fit is skipped, and said so
                print(f"{name} {t}: skipped ({type(e).__name__}: {str(e).splitlines()[0][:80]})")
        timings.sort()
        us, t = timings[0]
        best[name] = list(t)
        rows.append((name, t, us, nbytes / us / 1e3, timings))
    attn_us = chain_time_us([lambda i=i: attn.partials(q.view(1, heads, D), cache.k[i], cache.v[i], lens)
                             for i in range(L)])

    print(f"\nbatch-1 kernels, per launch (graph replay of {L} launches on distinct weights), context {args.context}")
    print(f"{'kernel':<10}{'best tiles':<14}{'us':>8}{'GB/s':>9}   others (us)")
    for name, t, us, gbs, timings in rows:
        others = " ".join(f"{tt}:{u:.1f}" for u, tt in timings[1:5])
        print(f"{name:<10}{str(t):<14}{us:>8.2f}{gbs:>9.0f}   {others}")
    print(f"{'attention':<10}{'':<14}{attn_us:>8.2f}")
    per_layer = sum(us for n, _, us, _, _ in rows if n != "lm_head") + attn_us
    lm = next(us for n, _, us, _, _ in rows if n == "lm_head")
    parts_ms = (L * per_layer + lm) / 1e3
    floor_ms = c.weight_bytes_read_per_pass() / (COPY_GBS * 1e9) * 1e3
    print(f"sum of parts: {L} x {per_layer:.1f} us + lm_head {lm:.1f} us = {parts_ms:.3f} ms "
          f"(weight-read floor {floor_ms:.3f} ms at {COPY_GBS:.0f} GB/s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tiles": best, "parts_ms": parts_ms, "per_layer_us": per_layer, "lm_head_us": lm,
                       "attention_us": attn_us,
                       "kernels": {n: {"tiles": list(t), "us": us, "gb_s": g} for n, t, us, g, _ in rows}}, f, indent=1)


if __name__ == "__main__":
    main()
