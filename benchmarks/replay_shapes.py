"""Time a committed open run's own pass shapes again, outside the serving loop: in the run's own
order, and shuffled. Where the first matches the run's logged times and the second the
calibration sweep's, what a pass follows is what differs; where both match the log, the sweep's
shapes are not the run's.

The open seed runs' decode passes (8-32 sequences, a few of 4,096 positions) ran about 6%
faster than the sweep's passes of the same composition (`results/calibration/README.md`); this
is the measurement that tells the two explanations apart.

    python benchmarks/replay_shapes.py results/continuous/seed-r30-continuous-20261130T030124 [--passes 400]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from calibrate.sweep import Shape, blocks_needed, run_sweep
from core.runstore import RunStore
from engine.continuous import ModelRunner
from engine.paged import PagedKVCache
from engine.provenance import resolve_device
from engine.weights import load_model


def run_shapes(run_dir: Path, passes: int, seed: int = 0) -> list[tuple[str, Shape, float]]:
    """(kind, shape, logged seconds) of `passes` consecutive passes from the middle of the run."""
    store, run_id = RunStore(run_dir.parent), run_dir.name
    logged = sorted(store.passes(run_id), key=lambda p: p.start_s)
    mid = max(0, len(logged) // 2 - passes // 2)
    out = []
    for p in logged[mid:mid + passes]:
        out.append((p.kind, Shape(f"pass {p.step}", tuple(zip(p.context_lens, p.new_tokens))), p.duration_s))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a run directory under results/continuous")
    ap.add_argument("--passes", type=int, default=400, help="consecutive passes from the middle of the run")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--model", default=None, help="default qwen2.5-1.5b on a GPU, tiny on a CPU")
    args = ap.parse_args()
    if not args.run.is_dir():
        print(f"error: {args.run}: no such run directory", file=sys.stderr)
        return 2
    device = resolve_device(args.device)
    gpu = device.type == "cuda"
    model, _ = load_model(args.model or ("qwen2.5-1.5b" if gpu else "tiny"), torch.float16 if gpu else torch.float32,
                          device)
    picked = run_shapes(args.run, args.passes)
    shapes = [s for _, s, _ in picked]
    cache = PagedKVCache(model.config, max(blocks_needed(s, 16) for s in shapes), 16, model.embed_tokens.weight.dtype,
                         device)
    runner = ModelRunner(model, cache, 256, "triton" if gpu else "eager", graphs=gpu)
    results = {}
    for order in ("own order", "shuffled"):
        timed = run_sweep(runner, shapes, repeats=1, seed=1, run_id="replay", shuffled=order == "shuffled")
        results[order] = {tuple(zip(r.context_lens, r.new_tokens)): r.duration_s for r in timed}
    print(f"{args.run.name}: {len(picked)} passes from its middle, timed again on {device}")
    print(f"  {'kind':<8}{'passes':>7}{'logged ms':>11}{'own order':>11}{'shuffled':>10}")
    for kind in sorted({k for k, _, _ in picked}):
        rows = [(s, t) for k, s, t in picked if k == kind]
        logged = statistics.mean(t for _, t in rows) * 1e3
        own = statistics.mean(results["own order"][s.seqs] for s, _ in rows) * 1e3
        shuffled = statistics.mean(results["shuffled"][s.seqs] for s, _ in rows) * 1e3
        print(f"  {kind:<8}{len(rows):>7}{logged:>11.3f}{own:>11.3f}{shuffled:>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
