"""Do where a sequence's KV blocks lie, or what they hold, change a pass's time? Decode and prompt
passes timed with block tables laid end to end (as `calibrate sweep` lays them) and with blocks
drawn at random from a cache the size of a serving engine's (as a long-running engine's free list
hands them out), and with the cache holding values of N(0, 1) (as the sweep fills it), N(0, 0.05)
or zeros, in interleaved rounds through the continuous engine's runner.

    python benchmarks/block_layout.py [--repeats 5] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
from collections import defaultdict

import torch

from calibrate.sweep import Shape, run_sweep
from engine.continuous import ModelRunner
from engine.paged import PagedKVCache
from engine.weights import build_random


def shapes() -> list[Shape]:
    rng = random.Random(0)
    out = []
    for b in (8, 32, 128, 256):
        for c in (512, 2048, 8192):
            out.append(Shape(f"decode b{b} c{c}", tuple((c, 1) for _ in range(b))))
        tail = [int(min(max(rng.lognormvariate(7.0, 1.0), 16), 16384)) for _ in range(b)]
        out.append(Shape(f"decode b{b} tail", tuple((c, 1) for c in tail)))
    out += [Shape("prompt 2048 on 4096", ((4096, 2048),)), Shape("prompts 4x1024", ((0, 1024),) * 4)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--reserve-gib", type=float, default=8.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    model = build_random("qwen2.5-1.5b", dtype="float16", device="cuda")
    free = torch.cuda.mem_get_info()[0] - args.reserve_gib * 2**30
    blocks = PagedKVCache.blocks_that_fit(model.config, free, 16, torch.float16)
    cache = PagedKVCache(model.config, blocks, 16, torch.float16, "cuda")
    runner = ModelRunner(model, cache, 256, "triton", graphs=True)
    grid = shapes()
    result = {}
    fills = {"end to end": 1.0, "scattered": 1.0, "values N(0, 0.05)": 0.05, "values 0": 0.0}
    for layout, std in fills.items():
        records = run_sweep(runner, grid, repeats=args.repeats, seed=1, scatter=layout == "scattered", fill_std=std)
        by = defaultdict(list)
        for p in records:
            by[(tuple(p.context_lens), tuple(p.new_tokens))].append(p.duration_s * 1e3)
        result[layout] = {s.group: statistics.median(by[(tuple(c for c, _ in s.seqs), tuple(n for _, n in s.seqs))])
                          for s in grid}
    print(f"{blocks:,} KV blocks; median ms of {args.repeats} interleaved passes")
    print(f"  {'shape':<22}" + "".join(f"{k:>18}" for k in result) + "   each / end to end")
    for s in grid:
        row = [result[k][s.group] for k in result]
        print(f"  {s.group:<22}" + "".join(f"{v:18.3f}" for v in row) + "   "
              + " ".join(f"{v / row[0] - 1:+.1%}" for v in row[1:]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
