"""How the GPU's pass times answer to prompt work, measured by design rather than inferred.

The calibration's heat model (`sim/heat.py`) was fitted on the sweep's shuffled pass stream: it
says a pass after long prefill runs up to ~8% slower and the card recovers over ~50 ms. Whether
the slow-down sets in at once or builds up during a long prompt pass, and whether a slower part
(temperature, over seconds) sits under it, that stream cannot tell. Here, after a rest each time:

- `rested`:   a probe decode pass (64 sequences on 512 cached positions) 100 times;
- `burst K`:  K prompt passes of 4,096 tokens back to back (K = 1 .. 100: 20 ms .. 2 s), then the
              probe 400 times (about 0.9 s): the prompts' own times show the onset, the probes
              the recovery;
- `big`:      one pass of 16 prompts of 4,096 tokens (65,536 tokens, about 0.3 s), rested, and
  `big-hot`:  the same after a 50-pass burst;
- `decode`:   the probe 1,000 times from rest (does decode work alone heat the card?).

Every segment R times, round-robin. Passes run as the serving loop runs them (each built and
launched while the one before it runs), timed with CUDA events. nvidia-smi samples the SM clock,
power and temperature every 20 ms beside it. Writes OUT/passes.jsonl (one PassRecord each, start_s
on one clock for the whole run), OUT/segments.json and OUT/telemetry.csv.

    python benchmarks/heat_response.py --out OUT [--repeats 3] [--rest 1.5]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from calibrate.sweep import Shape, blocks_needed, run_sweep
from engine.continuous import ModelRunner
from engine.paged import PagedKVCache
from engine.provenance import provenance, resolve_device
from engine.weights import load_model

PROBE = Shape("probe b64 c512", tuple((512, 1) for _ in range(64)))
PROMPT = Shape("prompt n4096", ((0, 4096),))
BIG = Shape("prompts 16x4096", tuple((0, 4096) for _ in range(16)))
BURSTS = (1, 3, 10, 30, 100)


def segments() -> list[tuple[str, list[Shape]]]:
    out = [("rested", [PROBE] * 100)]
    out += [(f"burst {k}", [PROMPT] * k + [PROBE] * 400) for k in BURSTS]
    out += [("big", [BIG] + [PROBE] * 100), ("big-hot", [PROMPT] * 50 + [BIG] + [PROBE] * 100),
            ("decode", [PROBE] * 1000)]
    return out


def telemetry(path: Path, gpu_index: str):
    """nvidia-smi sampling every 20 ms into `path` (None where there is no nvidia-smi)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    fields = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active"
    probe = subprocess.run([smi, f"--query-gpu={fields}", "--format=csv,noheader", "-i", gpu_index],
                           capture_output=True, text=True)
    if probe.returncode != 0:  # older drivers name it the throttle reasons
        fields = fields.replace("clocks_event_reasons", "clocks_throttle_reasons")
    return subprocess.Popen([smi, f"--query-gpu={fields}", "--format=csv", "-lms", "20", "-i", gpu_index],
                            stdout=path.open("w"), stderr=subprocess.DEVNULL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rest", type=float, default=1.5, help="seconds idle before each segment")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--model", default=None, help="default qwen2.5-1.5b on a GPU, tiny on a CPU")
    args = ap.parse_args()
    device = resolve_device(args.device)
    gpu = device.type == "cuda"
    plan = segments()
    if not gpu:  # a smoke run: the tiny model, short segments
        plan = [(name, shapes[:12]) for name, shapes in plan]
    model, weights = load_model(args.model or ("qwen2.5-1.5b" if gpu else "tiny"),
                                torch.float16 if gpu else torch.float32, device)
    shapes = {s for _, seg in plan for s in seg}
    cache = PagedKVCache(model.config, max(blocks_needed(s, 16) for s in shapes), 16, model.embed_tokens.weight.dtype,
                         device)
    runner = ModelRunner(model, cache, 64, "triton" if gpu else "eager", graphs=gpu)
    args.out.mkdir(parents=True, exist_ok=True)
    # warm-up: every shape once (compiles, captures graphs), untimed
    run_sweep(runner, sorted(shapes, key=lambda s: s.group), repeats=1, run_id="warm-up", launch="served")
    # nvidia-smi counts every GPU of the machine, CUDA only the visible ones
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0] or str(device.index or 0)
    smi = telemetry(args.out / "telemetry.csv", visible) if gpu else None
    origin_wall, origin = time.time(), time.perf_counter()
    records, marks = [], []
    try:
        for rep in range(args.repeats):
            for name, seg in plan:
                time.sleep(args.rest)
                passes = run_sweep(runner, seg, repeats=1, run_id=f"{name} r{rep}", shuffled=False,
                                   launch="served", warm_up=False)
                t0 = runner.clock.t0 - origin  # the sweep zeroes the runner's clock as it starts
                first = len(records)
                records += [dataclasses.replace(p, start_s=p.start_s + t0, step=first + i) for i, p in enumerate(passes)]
                marks.append({"segment": name, "repeat": rep, "t0_s": t0, "first": first, "last": len(records) - 1})
                print(f"{name} r{rep}: {len(passes)} passes, {sum(p.duration_s for p in passes):.3f} s busy",
                      flush=True)
    finally:
        if smi is not None:
            smi.terminate()
    with (args.out / "passes.jsonl").open("w") as f:
        for p in records:
            f.write(json.dumps(dataclasses.asdict(p)) + "\n")
    meta = {"weights": weights, "origin_unix_s": origin_wall, "rest_s": args.rest, "repeats": args.repeats,
            **provenance(device), "segments": marks}
    (args.out / "segments.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{len(records)} passes -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
