"""How fast the simulator runs, three ways.

Default: the full Azure 2023 conversation trace (19,366 requests over 58 minutes), continuous
batching, one replica, the roofline cost for an H200, simulated in this process; prints wall
seconds, simulated requests and passes per wall second (passes simulated, fast-forwarded ones
included). Pass records and per-token times are not kept (the request records keep the ITL
summary); `--log-passes` / `--token-times` turn them on.

`--command`: the whole command a user types, `python -m sim run --trace <Azure conv> --out DIR`
(start-up, trace check, simulation, metrics, records written), timed as a subprocess, and the
import time of `sim.__main__` alone.

`--scale`: 10^4, 10^5, 10^6 and 2x10^6 requests from the project's generator (Poisson arrivals,
lognormal prompt and output lengths with the Azure conversation trace's median and p90), at
`--rate-per-replica` requests per second on each replica (default 10: every replica has a
request in it about 90% of the time), continuous batching, 1 and 8 replicas behind round robin.
Each point runs in a subprocess of its own, so its peak RSS is its own; prints the time to
generate the trace, simulate it and compute the metrics, and the peak RSS.

Run it alone on one core, e.g. `taskset -c 0 python benchmarks/sim_speed.py --scale`; every
figure is the best of `--repeat` runs.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from core.config import get_preset  # noqa: E402
from core.kv import BlockPool, blocks_for_gpu  # noqa: E402
from core.metrics import compute_metrics  # noqa: E402
from core.roofline import get_gpu  # noqa: E402
from core.scheduler import ContinuousBatching  # noqa: E402
from sim.cost import RooflineCost, parse_cost  # noqa: E402
from sim.run import simulate  # noqa: E402
from traces import generate  # noqa: E402
from traces.io import load_trace  # noqa: E402

AZURE_CONV = ROOT.parent / "shared" / "traces" / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
SIZES = (10_000, 100_000, 1_000_000, 2_000_000)


def lognormal(median: float, p90: float, high: int) -> generate.Sampler:
    """Lengths drawn from the lognormal with this median and 90th percentile, in 1..high."""
    sigma = np.log(p90 / median) / 1.2815515655446004  # the standard normal's 90th percentile
    return lambda rng, n: np.clip(np.rint(rng.lognormal(np.log(median), sigma, n)), 1, high).astype(np.int64)


AZURE_PROMPTS = lognormal(1020, 2734, 14050)  # the conversation trace: p50 / p90 / max prompt tokens
AZURE_OUTPUTS = lognormal(129, 424, 1000)


def setup():
    model, gpu = get_preset("qwen2.5-1.5b"), get_gpu("h200")
    blocks = blocks_for_gpu(model, gpu)
    return RooflineCost(model, gpu), gpu, lambda: ContinuousBatching(BlockPool(blocks),
                                                                      max_model_len=model.context_length)


def busy_fraction(table, replicas: int) -> float:
    """The mean over replicas of the fraction of time a replica holds at least one request."""
    fractions = []
    for k in range(replicas):
        mine = table.replica == k
        arrive, finish = table.arrival_s[mine], np.maximum.accumulate(table.finish_s[mine])
        idle = np.clip(arrive[1:] - finish[:-1], 0, None).sum()
        fractions.append(1 - idle / (finish[-1] - arrive[0]))
    return float(np.mean(fractions))


def scale_point(n: int, replicas: int, rate: float) -> dict:
    """One size of the scale table, in this process: generate, simulate, compute the metrics."""
    cost, _, scheduler = setup()
    t0 = time.perf_counter()
    trace = generate.poisson(rate * replicas, n=n, prompt_tokens=AZURE_PROMPTS, output_tokens=AZURE_OUTPUTS, seed=0)
    t1 = time.perf_counter()
    result = simulate(trace, scheduler, cost, replicas)
    t2 = time.perf_counter()
    metrics = compute_metrics(result.table)
    t3 = time.perf_counter()
    return {"requests": n, "replicas": replicas, "generate_s": t1 - t0, "simulate_s": t2 - t1, "metrics_s": t3 - t2,
            "wall_s": t3 - t0, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "passes": result.num_passes, "steps": result.num_steps, "busy": busy_fraction(result.table, replicas),
            "mean_ttft_ms": metrics.ttft.mean * 1e3, "mean_tpot_ms": metrics.tpot.mean * 1e3}


def scale(args) -> None:
    print(f"Poisson arrivals at {args.rate_per_replica:g} req/s per replica, Azure-like lengths (lognormal: prompt "
          f"p50 1020, p90 2734; output p50 129, p90 424), continuous batching, roofline H200, best of {args.repeat}; "
          "each point in its own process")
    print(f"{'requests':>10} {'replicas':>8} {'generate s':>10} {'simulate s':>10} {'metrics s':>9} {'wall s':>8} "
          f"{'peak RSS MB':>11} {'req/wall s':>10} {'busy':>5} {'TTFT ms':>7} {'TPOT ms':>7}")
    for replicas in args.replicas:
        for n in args.sizes:
            runs = []
            for _ in range(args.repeat):
                out = subprocess.run([sys.executable, __file__, "--scale-point", str(n), str(replicas),
                                      str(args.rate_per_replica)], capture_output=True, text=True, check=True)
                runs.append(json.loads(out.stdout.splitlines()[-1]))
            best = min(runs, key=lambda r: r["wall_s"])
            print(f"{n:>10,} {replicas:>8} {best['generate_s']:>10.2f} {best['simulate_s']:>10.2f} "
                  f"{best['metrics_s']:>9.2f} {best['wall_s']:>8.2f} {max(r['peak_rss_mb'] for r in runs):>11.0f} "
                  f"{n / best['wall_s']:>10,.0f} {best['busy']:>5.2f} {best['mean_ttft_ms']:>7.1f} "
                  f"{best['mean_tpot_ms']:>7.2f}", flush=True)


def command(args) -> None:
    """The whole `python -m sim run ... --out DIR`, and the import of sim.__main__ alone."""
    runs, imports = [], []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as scratch:
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "sim", "run", "--trace", str(args.trace), "--out",
                            str(Path(scratch) / "out")], cwd=ROOT, check=True, capture_output=True)
            runs.append(time.perf_counter() - t)
            written = sum(f.stat().st_size for f in (Path(scratch) / "out").iterdir())
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import sim.__main__"], cwd=ROOT, check=True)
        imports.append(time.perf_counter() - t)
    print(f"python -m sim run --trace {args.trace.name} --out DIR: {min(runs):.2f} s "
          f"(best of {args.repeat}: {', '.join(f'{r:.2f}' for r in runs)}), {written / 1e6:.1f} MB written")
    print(f"python -c 'import sim.__main__': {min(imports):.2f} s "
          f"(best of {args.repeat}: {', '.join(f'{r:.2f}' for r in imports)}; a bare interpreter is part of it)")


def azure(args) -> None:
    t0 = time.perf_counter()
    trace = load_trace(args.trace)
    load_s = time.perf_counter() - t0
    cost, gpu, scheduler = setup()
    if args.cost:  # another cost model than the roofline (e.g. calibrated:h200)
        cost = parse_cost(args.cost)
        cost = cost[0] if isinstance(cost, tuple) else cost

    def run():
        return simulate(trace, scheduler, cost, log_passes=args.log_passes, keep_token_times=args.token_times)

    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(run)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    results = [run() for _ in range(args.repeat)]
    best = min(results, key=lambda r: r.wall_s)
    done = int(best.table.completed_mask().sum())
    print(f"trace: {args.trace.name}, {len(trace):,} requests over {trace.span_s / 60:.1f} min "
          f"(loaded in {load_s:.2f} s)")
    print(f"policy: continuous batching, 1 replica, {args.cost or 'roofline cost ' + gpu.name}; pass records "
          f"{'kept' if args.log_passes else 'off'}, token times {'kept' if args.token_times else 'off'}")
    print(f"simulated {done:,} requests to {best.end_s:,.0f} s, {best.num_passes:,} passes")
    print(f"wall: {best.wall_s:.3f} s (best of {args.repeat}: "
          f"{', '.join(f'{r.wall_s:.3f}' for r in results)})")
    print(f"requests per wall second: {len(trace) / best.wall_s:,.0f}")
    print(f"passes per wall second:   {best.num_passes / best.wall_s:,.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=AZURE_CONV)
    ap.add_argument("--repeat", type=int, default=3, help="runs; the best is reported (default 3)")
    ap.add_argument("--cost", default=None, help="cost model of the default run (default: the roofline, H200)")
    ap.add_argument("--log-passes", action="store_true", help="keep a PassRecord per pass")
    ap.add_argument("--token-times", action="store_true", help="keep every token's time")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of one run")
    ap.add_argument("--command", action="store_true", help="time the whole `python -m sim run ... --out DIR`")
    ap.add_argument("--scale", action="store_true", help="the scale table: 10^4 .. 2x10^6 generated requests")
    ap.add_argument("--sizes", type=lambda s: [int(float(x)) for x in s.split(",")], default=list(SIZES))
    ap.add_argument("--replicas", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--rate-per-replica", type=float, default=10.0)
    ap.add_argument("--scale-point", nargs=3, metavar=("N", "REPLICAS", "RATE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.scale_point:
        n, replicas, rate = args.scale_point
        print(json.dumps(scale_point(int(n), int(replicas), float(rate))))
    elif args.scale:
        scale(args)
    elif args.command:
        command(args)
    else:
        azure(args)


if __name__ == "__main__":
    main()
