"""Does the GPU slow over seconds of sustained work, beyond what the heat model's tens of
milliseconds hold? Designed sequences, each after a rest, each ending with a second of probe
passes (64 sequences on 512 cached positions) to see the recovery, timed as the serving loop
launches passes (`run_sweep(launch="served")`, every batch built once), with nvidia-smi's clocks
and power sampled beside them:

- `decode b256 10s`: decode passes of 256 sequences on 1,000 cached positions for about 10 s;
- `decode b64 10s`: the probe alone for about 10 s;
- `prompts 10s`: prompt passes of 4,096 tokens back to back for about 10 s;
- `serving 20s`: a 4,096-token prompt then ten decode passes of 256 sequences, over and over for
  about 20 s (the heat run's `serving` sequence, longer);
- `serving light 20s`: the same with a 1,024-token prompt.

Printed: per sequence and shape, the mean time in each second over the shape's mean in the
sequence's first 0.3 s. Written (--json): every pass and the sequences' marks; the telemetry CSV
beside it.

    python benchmarks/sustained_load.py --json OUT/sustained.json     # on a GPU, about 2.5 minutes
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from calibrate.response import PROBE, PROMPT, measure, telemetry  # noqa: E402
from calibrate.sweep import Shape, blocks_needed, run_sweep  # noqa: E402

DECODE = Shape("decode b256 c1000", tuple((1000, 1) for _ in range(256)))
SERVED = Shape("decode b256 c1024", tuple((1024, 1) for _ in range(256)))
LIGHT = Shape("prompt n1024", ((0, 1024),))
PASS_MS = {DECODE: 4.3, PROBE: 2.2, PROMPT: 22.0, SERVED: 4.4, LIGHT: 6.0}  # the H200's, rested, to size the sequences


def plan(scale: float = 1.0) -> list[tuple[str, list[Shape]]]:
    def n(seconds: float, ms: float) -> int:
        return max(2, int(seconds * scale * 1e3 / ms))
    probes = [PROBE] * n(1.0, PASS_MS[PROBE])
    cycle = PASS_MS[PROMPT] + 10 * PASS_MS[SERVED]
    light = PASS_MS[LIGHT] + 10 * PASS_MS[SERVED]
    return [("decode b256 10s", [DECODE] * n(10, PASS_MS[DECODE]) + probes),
            ("decode b64 10s", [PROBE] * n(10, PASS_MS[PROBE]) + probes),
            ("prompts 10s", [PROMPT] * n(10, PASS_MS[PROMPT]) + probes),
            ("serving 20s", ([PROMPT] + [SERVED] * 10) * n(20, cycle) + probes),
            ("serving light 20s", ([LIGHT] + [SERVED] * 10) * n(20, light) + probes)]


def drift(passes, marks) -> list[str]:
    """Per sequence and shape: the mean time in each second over its mean in the first 0.3 s."""
    lines = []
    for m in marks:
        seg = passes[m["first"]:m["last"] + 1]
        t0 = seg[0].start_s
        def shape(p) -> str:
            return f"{p.kind} b{len(p.new_tokens)} n{sum(p.new_tokens)}"
        for group in sorted({shape(p) for p in seg}):
            mine = [p for p in seg if shape(p) == group]
            t = np.array([p.start_s - t0 for p in mine])
            d = np.array([p.duration_s for p in mine])
            first = d[t < 0.3]
            if len(first) < 2:
                continue
            ref = first.mean()
            bins = [f"{d[(t >= s) & (t < s + 1)].mean() / ref - 1:+.1%}" for s in range(int(t.max()) + 1)
                    if ((t >= s) & (t < s + 1)).any()]
            lines.append(f"{m['segment']:<18} {group:<26} n={len(mine):5d}  by second: " + " ".join(bins))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True, help="where to write the passes (and NAME.telemetry.csv beside)")
    ap.add_argument("--rest", type=float, default=3.0, help="seconds idle before each sequence (default 3)")
    ap.add_argument("--scale", type=float, default=1.0, help="lengthen or shorten every sequence (default 1)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: sustained_load.py measures a GPU's clocks under load; this machine has no CUDA device",
              file=sys.stderr)
        return 2
    from engine.continuous import ModelRunner
    from engine.paged import PagedKVCache
    from engine.provenance import provenance
    from engine.weights import load_model

    device = torch.device("cuda")
    model, _ = load_model("qwen2.5-1.5b", torch.float16, device)
    sequences = plan(args.scale)
    shapes = sorted({s for _, seg in sequences for s in seg}, key=lambda s: s.group)
    cache = PagedKVCache(model.config, max(blocks_needed(s, 16) for s in shapes), 16, torch.float16, device)
    runner = ModelRunner(model, cache, max(len(s.seqs) for s in shapes), "triton", graphs=True)
    run_sweep(runner, shapes, repeats=1, run_id="warm-up", launch="served")  # compiles, captures graphs
    args.json.parent.mkdir(parents=True, exist_ok=True)
    csv = args.json.with_suffix(".telemetry.csv")
    smi = telemetry(csv, os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0])
    try:
        passes, marks = measure(runner, sequences, 1, args.rest, "sustained",
                                progress=lambda name, rep, ps: print(f"{name}: {len(ps)} passes, "
                                                                     f"{sum(q.duration_s for q in ps):.2f} s busy",
                                                                     flush=True))
    finally:
        if smi is not None:
            smi.terminate()
            smi.wait()
    print("\n".join(drift(passes, marks)))
    with gzip.open(args.json.with_suffix(".json.gz"), "wt") as f:
        json.dump({**provenance(device), "rest_s": args.rest, "segments": marks,
                   "passes": [{"kind": p.kind, "new_tokens": p.new_tokens, "context_lens": p.context_lens,
                               "start_s": p.start_s, "duration_s": p.duration_s} for p in passes]}, f)
    print(f"written {args.json.with_suffix('.json.gz')} and {csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
