"""Decode attention alone on served mixtures of contexts: does its time follow a batch's mean
context, as the cost model's form assumes (`sim.calibrated`), or the mixture?

For decode passes of many sequences taken from re-timed open runs (`benchmarks/replay_shapes.py
--json` files) or from open runs' pass logs (their directories), and with --designed for
mixtures by design at 32-512 sequences (one context for all, two modes in several shares,
log-uniform, a long tail), the paged decode-attention kernel is timed on the pass's own contexts, on the
same contexts sorted (longest last: which sequences' programs launch first), and on one context
of the same mean for every sequence; each as a CUDA graph of 28 launches (one a layer, as in a
pass), replayed back to back. Printed and written (--json): per pass its sequences, mean and
longest context, and the three times in microseconds a layer, beside the cost model's price of
the pass's attention for its mean and longest context (`decode_attention`, which is the same for
all three but for the longest).

    python benchmarks/attention_mixtures.py results/calibration-replays/replay-azure-continuous-20261130T135321.json.gz \
        results/calibration-replays/replay-seed-r100-continuous-20261130T135413.json.gz --passes 40

A GPU benchmark (the kernel is Triton's): on a machine without CUDA it says so and exits.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.config import get_preset  # noqa: E402
from sim.cost import parse_cost  # noqa: E402

BLOCK = 16   # the engine's KV block size


def decode_passes(path: Path, count: int, min_batch: int) -> list[list[int]]:
    """Contexts of `count` decode passes of at least `min_batch` sequences, spread over a
    replay_shapes.py --json file or a run directory's pass log (every replica's)."""
    if path.is_dir():
        from core.runstore import RunStore
        passes = [list(p.context_lens) for p in sorted(RunStore(path.parent).passes(path.name), key=lambda p: p.start_s)
                  if p.kind == "decode" and len(p.new_tokens) >= min_batch]
    else:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rt") as f:
            passes = [p["context_lens"] for p in json.load(f)["passes"]
                      if p["kind"] == "decode" and len(p["new_tokens"]) >= min_batch]
    step = max(1, len(passes) // count)
    return passes[::step][:count]


def designed(seed: int = 0) -> dict[str, list[list[int]]]:
    """Mixtures by design, to fit a form on: at several batch sizes, one context for all, two
    modes (short and long, in several shares), log-uniform, and a tail like the Azure trace's."""
    import random
    rng = random.Random(seed)
    out: dict[str, list[list[int]]] = {}
    for B in (32, 64, 96, 128, 192, 256, 384, 512):
        shapes = [[m] * B for m in (300, 1300, 2500, 4300)]
        for short in (0.25, 0.5, 0.75):  # the seed's kind: prompts of 16-256 and of 4,096, some tokens in
            k = round(B * short)
            shapes.append([rng.randint(16, 600) for _ in range(k)] + [rng.randint(4100, 4350) for _ in range(B - k)])
        shapes.append([round(math.exp(rng.uniform(math.log(16), math.log(8000)))) for _ in range(B)])
        shapes.append([min(7999, round(rng.lognormvariate(math.log(1000), 0.7))) for _ in range(B)])  # a tail
        out[f"designed b{B}"] = shapes
    return out


def time_layers(attention, q, k, v, contexts: list[int], out, reps: int, layers: int) -> float:
    """Microseconds a launch over `contexts` (a graph of `layers` launches, one a layer, replayed
    `reps` times)."""
    device = q.device
    B = len(contexts)
    lens = torch.tensor([c + 1 for c in contexts], dtype=torch.int32, device=device)
    width = max(-(-(c + 1) // BLOCK) for c in contexts)
    tables = torch.zeros((B, width), dtype=torch.int32, device=device)
    at = 0
    for i, c in enumerate(contexts):  # laid end to end, as the sweep lays them
        n = -(-(c + 1) // BLOCK)
        tables[i, :n] = torch.arange(at, at + n, dtype=torch.int32, device=device)
        at += n
    for _ in range(3):  # compiles, warms
        attention(q[:B], k, v, tables, lens, out[:B], batch=B)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(layers):
            attention(q[:B], k, v, tables, lens, out[:B], batch=B)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / layers)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path, help="replay_shapes.py --json files or open runs' directories")
    ap.add_argument("--designed", action="store_true", help="also designed mixtures (`designed`) at 32-512 sequences")
    ap.add_argument("--passes", type=int, default=40, help="decode passes a file (default 40)")
    ap.add_argument("--min-batch", type=int, default=128, help="of at least this many sequences (default 128)")
    ap.add_argument("--reps", type=int, default=20, help="graph replays a variant (default 20)")
    ap.add_argument("--cost", default="calibrated:h200", help="the cost model whose attention term is printed beside")
    ap.add_argument("--json", type=Path, default=None, help="also write every pass's times here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: attention_mixtures.py times a Triton kernel on a GPU; this machine has no CUDA device",
              file=sys.stderr)
        return 2
    from engine.kernels.attention import PagedDecodeAttention
    from engine.provenance import provenance

    for f in args.files:
        if not f.exists():
            print(f"error: {f}: no such file or run directory", file=sys.stderr)
            return 2
    cost, _ = parse_cost(args.cost)
    cfg = get_preset("qwen2.5-1.5b")
    heads, kv_heads, D, layers = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.num_hidden_layers
    device = torch.device("cuda")
    shapes = {f.name: decode_passes(f, args.passes, args.min_batch) for f in args.files}
    if args.designed:
        shapes.update(designed())
    if not any(shapes.values()):
        print("error: no decode passes to time (give files or runs with big enough batches, or --designed)",
              file=sys.stderr)
        return 2
    B = max(len(c) for ctx in shapes.values() for c in ctx)
    held = max(sum(-(-(c + 1) // BLOCK) for c in ctx) for cs in shapes.values() for ctx in cs)
    longest = max(c for cs in shapes.values() for ctx in cs for c in ctx) + 1
    k = torch.randn((held, BLOCK, kv_heads, D), dtype=torch.float16, device=device)
    v = torch.randn_like(k)
    q = torch.randn((B, heads, D), dtype=torch.float16, device=device)
    out = torch.empty((B, heads * D), dtype=torch.float16, device=device)
    attention = PagedDecodeAttention(B, heads, kv_heads, D, max(longest, 32768), BLOCK, device)
    rows = []
    print(f"decode attention alone, us a layer (median of {args.reps} replays of {layers} launches); "
          f"model: the cost model's decode_attention / {layers}")
    print(f"  {'file':<44}{'B':>5}{'mean':>7}{'max':>7}{'served':>9}{'sorted':>9}{'uniform':>9}{'model':>9}")
    for name, passes in shapes.items():
        for ctx in passes:
            S, mean = len(ctx), round(sum(ctx) / len(ctx))
            t = {name: time_layers(attention, q, k, v, c, out, args.reps, layers)
                 for name, c in (("served", ctx), ("sorted", sorted(ctx)), ("uniform", [mean] * S))}
            _, *shape = cost.decode_shape(S, sum(ctx), max(ctx))
            model = cost.decode_attention(*shape) * 1e6 / layers
            rows.append({"file": name, "contexts": ctx, **t, "model": model})
            print(f"  {name[:43]:<44}{S:>5}{mean:>7}{max(ctx):>7}" + "".join(f"{t[c]:>9.2f}" for c in t)
                  + f"{model:>9.2f}")
    for name in shapes:
        mine = [r for r in rows if r["file"] == name]
        if not mine:
            continue
        print(f"{name}: served / uniform of the same mean {statistics.mean(r['served'] / r['uniform'] for r in mine):.3f}, "
              f"sorted / served {statistics.mean(r['sorted'] / r['served'] for r in mine):.3f}, "
              f"served / model {statistics.mean(r['served'] / r['model'] for r in mine):.3f}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**provenance(device), "layers": layers, "passes": rows}))
        print(f"written {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
