"""Time a committed open run's own pass shapes again, outside the serving loop, three ways: as the
calibration sweep times passes (in windows launched back to back behind a lead), in the run's own
order and shuffled; and as the serving loop launches them (the next built and launched while the
current one runs, no lead), in the run's order; with --long-window N, also N at a time back to
back in the run's order (all of them: the GPU as busy as serving keeps it).

The open seed runs' decode passes (8-32 sequences, a few of 4,096 positions) ran about 6%
faster than the sweep's passes of the same composition (`results/calibration/README.md`). Where
the sweep's own-order and shuffled times agree with each other but not with the log, what a pass
follows is not the cause; where "as served" matches the log and the sweep's columns do not, the
way the sweep launches passes is.

    python benchmarks/replay_shapes.py results/continuous-repeats/seed-r30-continuous-20261130T030124 [--passes 400]
"""
from __future__ import annotations

import argparse
import json
from contextlib import contextmanager
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from calibrate.response import telemetry
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
    ap.add_argument("--scatter", action="store_true",
                    help="also time them in the sweep's windows (own order) with every sequence's KV blocks drawn at "
                         "random from a serving-sized cache (the memory free less 8 GiB), as a long-running engine's "
                         "free list hands them out at worst")
    ap.add_argument("--long-window", type=int, default=0, metavar="N",
                    help="also time them in the run's own order N at a time back to back (one window of the whole "
                         "replay keeps the GPU as busy as serving does, where the sweep's windows of 16 let it rest "
                         "while the host builds the next)")
    ap.add_argument("--telemetry", type=Path, default=None,
                    help="sample nvidia-smi's clocks, power and temperature every 20 ms into this CSV while timing, "
                         "and record each column's wall-clock span in --json")
    ap.add_argument("--json", type=Path, default=None,
                    help="also write every pass's shape and times (ms) to this file, with the GPU, torch and commit")
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
    widest = max(256, max(len(s.seqs) for s in shapes))  # (the open runs' limit, a sweep's batches up to 1,024)
    runner = ModelRunner(model, cache, widest, "triton" if gpu else "eager", graphs=gpu)
    columns = {"logged": [t for _, _, t in picked]}
    spans = {}  # column -> (first, last) wall-clock second of its timing (for --telemetry)

    @contextmanager
    def span(name: str):
        began = time.time()
        yield
        spans[name] = (began, time.time())
    smi = telemetry(args.telemetry, os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]) \
        if args.telemetry is not None and gpu else None
    def in_shape_order(timed) -> list[float]:
        """The timed passes' durations in the order of `shapes` (a sweep may time them shuffled)."""
        by_shape = {tuple(zip(r.context_lens, r.new_tokens)): r.duration_s for r in timed}
        return [by_shape[s.seqs] for s in shapes]
    for order in ("own order", "shuffled"):  # as the calibration sweep times them
        with span(f"sweep, {order}"):
            timed = run_sweep(runner, shapes, repeats=1, seed=1, run_id="replay", shuffled=order == "shuffled")
        columns[f"sweep, {order}"] = in_shape_order(timed)
    with span("as served"):
        timed = run_sweep(runner, shapes, repeats=1, seed=1, run_id="replay", shuffled=False, launch="served")
    columns["as served"] = [r.duration_s for r in timed]
    if args.long_window > 0:  # own order, whole windows back to back: the GPU without the sweep's rests
        name = f"sweep, {args.long_window} back to back"
        with span(name):
            timed = run_sweep(runner, shapes, repeats=1, seed=1, run_id="replay", shuffled=False, warm_up=False,
                              window=args.long_window)
        columns[name] = [r.duration_s for r in timed]
    if smi is not None:
        smi.terminate()
        smi.wait()
    if args.scatter:  # a serving-sized cache, blocks drawn at random from all of it
        del runner, cache
        free = torch.cuda.mem_get_info(device)[0] - 8 * 2**30 if gpu else 2**28
        dtype = model.embed_tokens.weight.dtype
        cache = PagedKVCache(model.config, PagedKVCache.blocks_that_fit(model.config, free, 16, dtype), 16, dtype, device)
        runner = ModelRunner(model, cache, widest, "triton" if gpu else "eager", graphs=gpu)
        timed = run_sweep(runner, shapes, repeats=1, seed=1, run_id="replay", shuffled=False, scatter=True)
        columns["sweep, scattered"] = in_shape_order(timed)
    print(f"{args.run.name}: {len(picked)} passes from its middle, timed again on {device}; mean ms per pass")
    widths = [max(20, len(name) + 2) for name in columns]
    print(f"  {'kind':<8}{'passes':>7}" + "".join(f"{name:>{w}}" for name, w in zip(columns, widths)))
    for kind in sorted({k for k, _, _ in picked}):
        rows = [i for i, (k, _, _) in enumerate(picked) if k == kind]
        means = [statistics.mean(column[i] for i in rows) * 1e3 for column in columns.values()]
        print(f"  {kind:<8}{len(rows):>7}" + "".join(f"{m:>{w}.3f}" for m, w in zip(means, widths)))
    if args.json is not None:
        from engine.provenance import provenance
        passes = [{"kind": kind, "context_lens": [c for c, _ in shape.seqs], "new_tokens": [n for _, n in shape.seqs],
                   **{name: column[i] * 1e3 for name, column in columns.items()}}
                  for i, (kind, shape, _) in enumerate(picked)]
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"run": args.run.name, **provenance(device), "spans": spans, "passes": passes}))
        print(f"written {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
