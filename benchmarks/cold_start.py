"""How a first pass on an idle GPU depends on how long the GPU idled: closed runs of the continuous
engine (`engine.continuous.closed_run`, as `python -m engine bench --engine continuous` runs them)
of one prompt and a few decode steps, each after a rest drawn from a grid, in shuffled order; per
run the GPU's idle time before its first pass (from the pass logs' clocks, as the bench records
`idle_before_s`: `engine.bench.gpu_idle_before`), that pass's start (the host's planning, from the
run's 0) and duration (on a GPU, CUDA events: it includes the graph's launch onto an idle GPU and a
cold GPU's slower first kernels), and TTFT.

    python benchmarks/cold_start.py --json out/cold-start.json            # on a GPU: about a minute
    python benchmarks/cold_start.py --device cpu --repeats 1              # a smoke run (tiny model)
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from engine.bench import gpu_idle_before  # noqa: E402
from engine.continuous import ModelRunner, closed_run  # noqa: E402
from engine.paged import PagedKVCache  # noqa: E402
from engine.prompts import batch_prompts  # noqa: E402
from engine.provenance import provenance, resolve_device  # noqa: E402
from engine.weights import load_model  # noqa: E402

RESTS_S = (0.0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
PROMPTS = ("p16", "p256", "p1024")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--model", default=None, help="default qwen2.5-1.5b on a GPU, tiny on a CPU")
    ap.add_argument("--repeats", type=int, default=8, help="runs of every prompt after every rest (default 8)")
    ap.add_argument("--new-tokens", type=int, default=8, help="tokens each run generates (default 8)")
    ap.add_argument("--json", type=Path, default=None, help="write every run's figures here, with GPU, torch, commit")
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    gpu = device.type == "cuda"
    model, _ = load_model(args.model or ("qwen2.5-1.5b" if gpu else "tiny"), torch.float16 if gpu else torch.float32,
                          device)
    prompts = {name: batch_prompts(name, 1) for name in PROMPTS}
    longest = max(len(p[0]) for p in prompts.values()) + args.new_tokens
    cache = PagedKVCache(model.config, 4 * -(-longest // 16), 16, model.embed_tokens.weight.dtype, device)
    runner = ModelRunner(model, cache, 4, "triton" if gpu else "eager", graphs=gpu)
    for name in PROMPTS:  # compiles, captures the graphs
        closed_run(runner, prompts[name], args.new_tokens, "warm-up")
    plan = [(name, rest) for name in PROMPTS for rest in RESTS_S for _ in range(args.repeats)]
    random.Random(0).shuffle(plan)
    rows = []
    for name, rest in plan:
        lead = closed_run(runner, prompts[name], 2, "lead")  # the GPU busy up to the rest, whatever ran before
        _, last_end = gpu_idle_before(runner.clock, lead.passes, None)
        time.sleep(rest)
        run = closed_run(runner, prompts[name], args.new_tokens, "cold")
        first = run.passes[0]
        idle, _ = gpu_idle_before(runner.clock, run.passes, last_end)
        rows.append({"prompt": name, "rest_s": rest, "idle_before_s": idle,
                     "first_start_ms": first.start_s * 1e3, "first_duration_ms": first.duration_s * 1e3,
                     "ttft_ms": (run.records[0].first_token_s - run.records[0].arrival_s) * 1e3})
    print(f"{len(rows)} runs on {device}; medians by prompt and rest (ms)")
    print(f"  {'prompt':<7}{'rest':>8}{'idle':>9}{'start':>8}{'first pass':>12}{'TTFT':>9}")
    for name in PROMPTS:
        for rest in RESTS_S:
            sel = [r for r in rows if r["prompt"] == name and r["rest_s"] == rest]
            med = {k: statistics.median(r[k] for r in sel) for k in ("idle_before_s", "first_start_ms",
                                                                      "first_duration_ms", "ttft_ms")}
            print(f"  {name:<7}{rest * 1e3:>8.1f}{med['idle_before_s'] * 1e3:>9.2f}{med['first_start_ms']:>8.3f}"
                  f"{med['first_duration_ms']:>12.3f}{med['ttft_ms']:>9.3f}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**provenance(device), "new_tokens": args.new_tokens, "runs": rows}))
        print(f"written {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
