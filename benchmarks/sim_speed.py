"""How fast the simulator runs: the full Azure 2023 conversation trace (19,366 requests over
58 minutes), continuous batching, one replica, the roofline cost for an H200.

Prints wall seconds, simulated requests per wall second and passes per wall second (passes
simulated, fast-forwarded ones included). Pass records and per-token times are not kept (the
request records keep the ITL summary); `--log-passes` / `--token-times` turn them on.
Run it alone on the machine, e.g. `taskset -c 0 python benchmarks/sim_speed.py`.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.config import get_preset  # noqa: E402
from core.roofline import get_gpu  # noqa: E402
from sim.cost import RooflineCost  # noqa: E402
from core.kv import BlockPool, blocks_for_gpu  # noqa: E402
from core.scheduler import ContinuousBatching  # noqa: E402
from sim.run import simulate  # noqa: E402
from traces.io import load_trace  # noqa: E402

AZURE_CONV = ROOT.parent / "shared" / "traces" / "azure2023" / "AzureLLMInferenceTrace_conv.csv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=AZURE_CONV)
    ap.add_argument("--repeat", type=int, default=3, help="runs; the best is reported (default 3)")
    ap.add_argument("--log-passes", action="store_true", help="keep a PassRecord per pass")
    ap.add_argument("--token-times", action="store_true", help="keep every token's time")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of one run")
    args = ap.parse_args()

    t0 = time.perf_counter()
    trace = load_trace(args.trace)
    load_s = time.perf_counter() - t0
    model, gpu = get_preset("qwen2.5-1.5b"), get_gpu("h200")
    cost = RooflineCost(model, gpu)
    blocks = blocks_for_gpu(model, gpu)

    def scheduler() -> ContinuousBatching:
        return ContinuousBatching(BlockPool(blocks), max_model_len=model.context_length)

    def run():
        return simulate(trace, scheduler, cost, log_passes=args.log_passes, keep_token_times=args.token_times)

    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(run)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    results = [run() for _ in range(args.repeat)]
    best = min(results, key=lambda r: r.wall_s)
    done = sum(r.completed for r in best.requests)
    print(f"trace: {args.trace.name}, {len(trace):,} requests over {trace.span_s / 60:.1f} min "
          f"(loaded in {load_s:.2f} s)")
    print(f"policy: continuous batching, 1 replica, roofline cost {gpu.name}; pass records "
          f"{'kept' if args.log_passes else 'off'}, token times {'kept' if args.token_times else 'off'}")
    print(f"simulated {done:,} requests to {best.end_s:,.0f} s, {best.num_passes:,} passes")
    print(f"wall: {best.wall_s:.3f} s (best of {args.repeat}: "
          f"{', '.join(f'{r.wall_s:.3f}' for r in results)})")
    print(f"requests per wall second: {len(trace) / best.wall_s:,.0f}")
    print(f"passes per wall second:   {best.num_passes / best.wall_s:,.0f}")


if __name__ == "__main__":
    main()
