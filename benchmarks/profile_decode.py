"""Where a decode step's time goes on a GPU, and which tile sizes the batch-1 kernels want.

1. Tiles: each batch-1 kernel (engine.kernels.gemv) is timed as a chain of 28 launches, one per
   layer on its own weights (so L2 does not flatter the smaller matrices), replayed as a CUDA
   graph, for several (rows, tile width, warps); the best of each is kept.
2. Steps: the real model's decode step, captured by GraphDecoder with those tiles, is timed by
   graph replay at batch 1 and at larger batches; then the same step is launched once with a CUDA
   event after every kernel, behind a long sleep kernel so the host's launches run ahead of the
   GPU, giving each kind of kernel's share of the step.
3. With --small: the small-batch kernels (engine.kernels.small_m, batches 2..16): each kernel's
   tiles (rows, tile width, warps, splits, stages) swept as a chain of 28 launches at each
   batch of --sweep-batches, the fastest kept per batch; then the decode step at every
   batch of --small-batches, graph-replayed at p256 (mid-way through 256 new tokens), on the old
   path (cuBLAS + small kernels, `run_layers`), the small-batch path with the default tiles and
   with the batch's best tiles (PDL off and on); batch 1 is the batch-1 kernels, and batches past
   16 run the small-batch kernels padded to 32 or 64 rows for reference. Rows go to --csv.

    python benchmarks/profile_decode.py [--json OUT.json] [--batches 1,64,256]
    python benchmarks/profile_decode.py --no-tune --batches 8 --small --csv OUT.csv
"""
from __future__ import annotations

import argparse
import csv
import gc
import itertools
import json
import sys
import time
from collections import defaultdict

import torch
import triton.testing

from core.config import get_preset
from engine.cuda_graphs import GraphDecoder
from engine.fast_path import SMALL_TILES
from engine.kernels import gemv as G
from engine.kernels import small_m as S
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
                 new_tokens: int = 256, small_tiles: dict | None = None, small_max: int = 16,
                 breakdown: bool = True) -> dict:
    """Graph-replay time of one decode step, and (with `breakdown`) each kernel kind's share of an
    instrumented step. small_max 1 puts batches of 2 or more on the old path (run_layers)."""
    ids = prompt_ids(prompt)
    dec = GraphDecoder(model, True, tiles, pdl=pdl, small_tiles=small_tiles, small_max=small_max)
    cache = dec.cache(batch, len(ids) + new_tokens)
    first = dec.prefill(torch.tensor([ids] * batch, device="cuda")).clone()
    middle = len(ids) + new_tokens // 2  # mid-way through the output
    pos = torch.full((batch,), middle, device="cuda")
    dec.start(first, pos)

    def one_step():  # back to the same position each time (one small fill kernel more than a real step)
        dec.positions.fill_(middle)
        dec.step()

    step_ms = triton.testing.do_bench(one_step, warmup=20, rep=200, return_mode="median")
    if not breakdown:
        return {"batch": batch, "pdl": pdl, "graph_step_ms": step_ms}
    fast = dec.fast
    if batch == 1:
        attend = lambda i, q, out: dec.attention(q, cache.k[i], cache.v[i], pos, out)  # noqa: E731
        run = lambda: fast.decode_b1(first, pos, cache.k, cache.v, attend)  # noqa: E731
    elif fast.uses_small(batch):
        shape = (batch, model.config.num_attention_heads, model.config.head_dim)
        attend = lambda i, q, out: dec.attention(q.view(shape), cache.k[i], cache.v[i], pos, out)  # noqa: E731
        run = lambda: fast.decode_small(first, pos, cache.k, cache.v, attend)  # noqa: E731
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
    path = "batch-1" if batch == 1 else "small-batch" if fast.uses_small(batch) else "cuBLAS"
    print(f"\nbatch {batch} ({path} kernels){' with PDL' if pdl else ''}: graph replay {step_ms:.3f} ms/step = {batch / step_ms * 1e3:,.0f} tok/s; "
          f"instrumented launch {instrumented:.3f} ms")
    for label, ms in sorted(share.items(), key=lambda kv: -kv[1]):
        print(f"  {label:<22}{ms:8.3f} ms  {100 * ms / instrumented:5.1f}%")
    return {"batch": batch, "pdl": pdl, "graph_step_ms": step_ms, "instrumented_ms": instrumented,
            "share_ms": dict(share)}


# The sweep's candidates per small-batch kernel: (rows, tile width, warps, splits, stages).
SMALL_GRID = {
    "qkv": {"rows": (16, 32), "block_k": (128, 256), "warps": (4,), "split": (1, 2, 4), "stages": (3,)},
    "o": {"rows": (16, 32, 64), "block_k": (128, 256), "warps": (4,), "split": (1, 2, 4, 8), "stages": (3,)},
    "gate_up": {"rows": (16, 32, 64), "block_k": (128, 256), "warps": (4,), "split": (1, 2), "stages": (3,)},
    "down": {"rows": (16, 32, 64), "block_k": (128, 256), "warps": (4,), "split": (2, 4, 8), "stages": (3,)},
    "lm_head": {"rows": (64, 128, 256), "block_k": (128, 256), "warps": (4, 8), "split": (1,), "stages": (3,)},
}
# Each program reads its rows' activations once per input tile as well as its weight tile: with
# as many weight rows as activation rows (16 and 16) that doubles the bytes read (the activations
# from L2), hence the wider row tiles in the grid.
SMALL_BATCHES = 16  # the small-batch kernels' range (2..16); batches past it run on them padded, for reference


def small_candidates(grid: dict = SMALL_GRID) -> dict[str, list[tuple]]:
    """Each kernel's candidate tiles, the engine's default first."""
    out = {}
    for name, axes in grid.items():
        tiles = list(itertools.product(axes["rows"], axes["block_k"], axes["warps"], axes["split"], axes["stages"]))
        out[name] = [SMALL_TILES[name]] + [t for t in tiles if t != SMALL_TILES[name]]
    return out


def fastest(timings: list[tuple[float, tuple]]) -> tuple[float, tuple]:
    """The fastest (us, tiles) of a list, skipped candidates (None) left out."""
    ok = [t for t in timings if t[0] is not None]
    if not ok:
        raise RuntimeError("no candidate ran")
    return min(ok, key=lambda t: t[0])


def small_kernel_chains(c, batch: int, cache_len: int, context: int, dev: str = "cuda"):
    """For each small-batch kernel: (bytes of weights a launch reads, make(tiles) -> the 28
    launches of a chain on distinct weights) at `batch` rows."""
    dt, L = torch.float16, c.num_hidden_layers
    H, I, D, heads, kvh = c.hidden_size, c.intermediate_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads
    qkv_n = (heads + 2 * kvh) * D
    r = lambda *s: torch.randn(*s, dtype=dt, device=dev) * 0.02  # noqa: E731
    w_qkv, b_qkv, w_o = [r(qkv_n, H) for _ in range(L)], [r(qkv_n) for _ in range(L)], [r(H, heads * D) for _ in range(L)]
    w_gu, w_down, emb = [r(2 * I, H) for _ in range(L)], [r(H, I) for _ in range(L)], r(c.vocab_size, H)
    norm = torch.ones(H, dtype=dt, device=dev)
    h, act, q, attn_out = r(batch, H), r(batch, I), r(batch, heads * D), r(batch, heads * D)
    logits = torch.empty(batch, c.vocab_size, dtype=dt, device=dev)
    cache = DenseKVCache(c, batch, cache_len, dt, dev)
    cos, sin = torch.randn(cache_len, D, dtype=dt, device=dev), torch.randn(cache_len, D, dtype=dt, device=dev)
    pos = torch.full((batch,), context - 1, device=dev)
    ws = S.Workspace()

    def kw(t):
        return {"rows": t[0], "block_k": t[1], "warps": t[2], "split": t[3], "stages": t[4], "workspace": ws}

    return {
        "qkv": (2 * qkv_n * H, lambda t: [lambda i=i: S.qkv_rope_cache(w_qkv[i], b_qkv[i], h, norm, 1e-6, pos, cos, sin,
                                                                       q, cache.k[i], cache.v[i], heads, kvh, **kw(t))
                                          for i in range(L)]),
        "o": (2 * H * heads * D, lambda t: [lambda i=i: S.linear(w_o[i], attn_out, h, residual=h, **kw(t))
                                            for i in range(L)]),
        "gate_up": (2 * 2 * I * H, lambda t: [lambda i=i: S.gate_up_silu(w_gu[i], h, norm, 1e-6, act, **kw(t))
                                              for i in range(L)]),
        "down": (2 * H * I, lambda t: [lambda i=i: S.linear(w_down[i], act, h, residual=h, **kw(t)) for i in range(L)]),
        "lm_head": (2 * c.vocab_size * H, lambda t: [lambda: S.linear(emb, h, logits, norm_weight=norm, **kw(t))]),
    }


def sweep_small_tiles(batches: list[int], cache_len: int = 512, context: int = 384, config=None,
                      device: str = "cuda", grid: dict = SMALL_GRID) -> tuple[dict, list[dict]]:
    """The fastest tiles of each small-batch kernel at each batch: {batch: tiles}, and a row per
    (batch, kernel, candidate). Qwen2.5-1.5B on the GPU unless told otherwise."""
    c = config or get_preset("qwen2.5-1.5b")
    candidates = small_candidates(grid)
    best, rows = {}, []
    for batch in batches:
        chains = small_kernel_chains(c, batch, cache_len, context, device)
        best[batch] = {}
        print(f"\nsmall-batch kernels at batch {batch}, per launch (graph replay of {c.num_hidden_layers} launches)")
        for name, (nbytes, make) in chains.items():
            timings = []
            for t in candidates[name]:
                try:
                    us = chain_time_us(make(t))
                except Exception as e:  # a tile that does not compile or fit is skipped, and said so
                    print(f"  {name} {t}: skipped ({type(e).__name__}: {str(e).splitlines()[0][:80]})")
                    us = None
                timings.append((us, t))
                rows.append({"section": "kernel", "batch": batch, "path": "small", "pdl": False, "kernel": name,
                             "tiles": "x".join(map(str, t)), "time_us": us,
                             "gb_s": None if us is None else nbytes / us / 1e3})
            us, t = fastest(timings)
            default = timings[0][0]
            best[batch][name] = t
            print(f"  {name:<8} best {t} {us:7.2f} us ({nbytes / us / 1e3:5.0f} GB/s); default {SMALL_TILES[name]} "
                  f"{'-' if default is None else f'{default:.2f}'} us")
        del chains
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return best, rows


def small_steps(model, batches: list[int], best: dict, suggested: dict | None = None, pdls=(False, True)) -> list[dict]:
    """The decode step at each batch: old path, small-batch path with the default tiles, the
    batch's best and the one set suggested for all batches."""
    rows = []

    def timed(batch, path, tiles, pdl, **kw):
        try:
            ms = step_profile(model, batch, None, pdl, breakdown=False, **kw)["graph_step_ms"]
        except Exception as e:  # report and go on: one failing variant should not hide the rest
            print(f"batch {batch} {path} pdl={pdl}: failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            ms = None
        rows.append({"section": "step", "batch": batch, "path": path, "pdl": pdl, "kernel": "step",
                     "tiles": tiles, "time_us": None if ms is None else ms * 1e3, "gb_s": None})
        gc.collect()  # the decoder's graphs and cache (held in cycles through its closures)
        torch.cuda.empty_cache()

    for batch in batches:
        if batch == 1:
            for pdl in pdls:
                timed(1, "batch-1", "engine", pdl)
            continue
        timed(batch, "old", "", False, small_max=1)
        forced = max(batch, SMALL_BATCHES)  # batches past 16: the small-batch kernels padded, for reference
        tiles = best.get(batch) or best.get(max((b for b in best if b <= batch), default=None)) or SMALL_TILES
        label = lambda t: ";".join(f"{k}={'x'.join(map(str, v))}" for k, v in t.items())  # noqa: E731
        one_set = {**SMALL_TILES, **(suggested or {})}
        for pdl in pdls:
            timed(batch, "small-default", label(SMALL_TILES), pdl, small_max=forced)
            if tiles != SMALL_TILES:
                timed(batch, "small-best", label(tiles), pdl, small_max=forced, small_tiles=tiles)
            if one_set not in (SMALL_TILES, tiles):
                timed(batch, "small-suggested", label(one_set), pdl, small_max=forced, small_tiles=one_set)
    return rows


def small_summary(rows: list[dict]) -> str:
    """One line per batch: the old path's step, the small-batch path's best, and the gain."""
    steps = [r for r in rows if r["section"] == "step" and r["time_us"] is not None]
    lines = [f"{'batch':>5} {'old ms':>8} {'new ms':>8} {'new/old':>8}  new path (pdl)"]
    for batch in sorted({r["batch"] for r in steps}):
        mine = [r for r in steps if r["batch"] == batch]
        old = next((r["time_us"] for r in mine if r["path"] == "old"), None)
        new = min((r for r in mine if r["path"] != "old"), key=lambda r: r["time_us"], default=None)
        if new is None:
            lines.append(f"{batch:>5} {old / 1e3:8.3f}")
            continue
        ratio = f"{new['time_us'] / old:8.3f}" if old else f"{'-':>8}"
        old_s = f"{old / 1e3:8.3f}" if old else f"{'-':>8}"
        lines.append(f"{batch:>5} {old_s} {new['time_us'] / 1e3:8.3f} {ratio}  {new['path']} ({new['pdl']}) "
                     f"{new['tiles']}")
    return "\n".join(lines)


def suggest_tiles(rows: list[dict]) -> dict:
    """Per kernel, the tiles with the least chain time summed over the swept batches (among those
    that ran at every one): one set for the engine's SMALL_TILES."""
    kernels = [r for r in rows if r["section"] == "kernel"]
    batches = {r["batch"] for r in kernels}
    out = {}
    for name in dict.fromkeys(r["kernel"] for r in kernels):
        total: dict[str, float] = defaultdict(float)
        seen: dict[str, set] = defaultdict(set)
        for r in kernels:
            if r["kernel"] == name and r["time_us"] is not None:
                total[r["tiles"]] += r["time_us"]
                seen[r["tiles"]].add(r["batch"])
        full = [t for t in total if seen[t] == batches]
        if full:
            out[name] = tuple(int(v) for v in min(full, key=total.get).split("x"))
    return out


def measured_on() -> dict:
    """What the figures were measured on: the card, its UUID, torch, the commit (engine.provenance)."""
    from engine.provenance import provenance
    return provenance(torch.device("cuda" if torch.cuda.is_available() else "cpu"))


def write_csv(path: str, rows: list[dict]) -> None:
    """The rows, each with the card, its UUID, torch and the commit it ran."""
    prov = measured_on()
    fields = ["section", "batch", "path", "pdl", "kernel", "tiles", "time_us", "gb_s"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fields + ["gpu", "gpu_uuid", "torch", "git_commit"])
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.3f}" if isinstance(r[k], float) else r[k]) for k in fields}
                       | {k: prov[k] for k in ("gpu", "gpu_uuid", "torch", "git_commit")})


def int_list(text: str) -> list[int]:
    return [int(b) for b in text.split(",") if b.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write tiles and breakdowns here")
    ap.add_argument("--batches", default="1,64,256", help="batch sizes for the step breakdown")
    ap.add_argument("--no-tune", action="store_true", help="skip the tile sweep; use the engine's tiles")
    ap.add_argument("--pdl", choices=("off", "on", "both"), default="off",
                    help="programmatic dependent launch on the batch-1 kernels")
    ap.add_argument("--small", action="store_true",
                    help="sweep the small-batch kernels' tiles and time the old and new decode paths by batch")
    ap.add_argument("--small-batches", default="1,2,4,8,16,32,64",
                    help="batches of the old/new comparison (the sweep takes those of 2..16)")
    ap.add_argument("--sweep-batches", default="2,8,16",
                    help="with --small: batches (2..16) the tiles are swept at; a batch between takes the tiles of "
                         "the largest swept batch below it")
    ap.add_argument("--csv", default=None, help="with --small: write its rows here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("profile_decode.py times CUDA graphs: it needs a CUDA GPU (torch.cuda.is_available() is False)")
    started = time.time()
    small_rows, best_small = [], {}
    if args.small:
        best_small, small_rows = sweep_small_tiles([b for b in int_list(args.sweep_batches) if 2 <= b <= SMALL_BATCHES])
        suggested = suggest_tiles(small_rows)
        print(f"\nsweep done at {time.time() - started:.0f} s; one set for all of batches 2..16 "
              f"(engine.fast_path.SMALL_TILES): {suggested}")
        if args.csv:  # written now too, in case the steps below run out of time
            write_csv(args.csv, small_rows)
    tiles, table = (None, []) if args.no_tune else tune_b1_tiles(cache_len=512, context=384)
    model = build_random("qwen2.5-1.5b", dtype="float16", device="cuda")
    floor_ms = model.config.weight_bytes_read_per_pass() / (COPY_GBS * 1e9) * 1e3
    print(f"\nweight-read floor of one step: {floor_ms:.3f} ms at {COPY_GBS:.0f} GB/s; tiles {tiles or 'default'}")
    pdls = {"off": [False], "on": [True], "both": [False, True]}[args.pdl]
    if args.small:
        small_rows += small_steps(model, int_list(args.small_batches), best_small, suggested)
        print(f"\ndecode step at p256, graph replay (old: cuBLAS + small kernels; new: batch-1 or small-batch "
              f"kernels, best of tiles and PDL); floor {floor_ms:.3f} ms\n" + small_summary(small_rows))
        if args.csv:
            write_csv(args.csv, small_rows)
            print(f"wrote {len(small_rows)} rows to {args.csv}")
    steps = []
    for b in int_list(args.batches):
        small = best_small.get(b)
        for pdl in (pdls if b == 1 else [False]):
            try:
                steps.append(step_profile(model, b, tiles, pdl, small_tiles=small))
            except Exception as e:  # report and go on: one failing variant should not hide the rest
                print(f"batch {b} pdl={pdl}: failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    print(f"\nelapsed {time.time() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**{k: v for k, v in measured_on().items() if k != "host"},
                       "tiles": tiles, "floor_ms": floor_ms, "steps": steps, "small_tiles": best_small,
                       "kernels": [{"name": n, "tiles": t, "us": us, "gb_s": g} for n, t, us, g, _ in table]},
                      f, indent=1)


if __name__ == "__main__":
    main()
