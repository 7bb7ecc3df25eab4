"""How far a calibration projected from another model is from a model's own measurements.

The simulator prices a model that has no calibration by the nearest calibrated model's, projected
by the two models' roofline terms (`sim.calibrated.CalibratedCost.projected_to_model`). This sets
that projection, the model's own calibration (where it has one) and the bare roofline against the
model's own measured passes on the same GPU:

- the latest calibration sweep of MODEL under RESULTS/calibration: every pass priced (with the
  cost model's heat) against its CUDA-event time, per pass kind and for batch 1's decodes apart;
- the closed runs of the continuous engine under RESULTS/continuous-closed: TTFT and ITL rebuilt
  from the priced passes (`calibrate.replay`), the run's own gaps kept.

The own calibration's sweep errors include the passes it was fitted on (its file holds its
held-out error); the projection and the roofline saw none of them.

    python benchmarks/projection_error.py --model llama-3.1-8b --base qwen2.5-1.5b
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibrate.replay import replay_runs  # noqa: E402
from core.config import resolve_model  # noqa: E402
from core.roofline import get_gpu  # noqa: E402
from core.runstore import RunStore  # noqa: E402
from sim.calibrated import CalibratedCost  # noqa: E402
from sim.cost import RooflineCost, find_calibration  # noqa: E402
from sim.heat import logged_times  # noqa: E402


def costs(model: str, base: str, gpu: str) -> dict:
    """{label: cost model} for MODEL on GPU: the base model's calibration projected, MODEL's own
    (if there is one), the roofline."""
    spec = get_gpu(gpu)
    base_file = find_calibration(gpu, base)
    if base_file is None:
        raise SystemExit(f"error: no calibration of {base} on {gpu} to project from")
    out = {f"projected from {base}": CalibratedCost.from_json(base_file).projected_to_model(
        resolve_model(base), resolve_model(model), spec)}
    own = find_calibration(gpu, model)
    if own is not None:
        out["own calibration"] = CalibratedCost.from_json(own)
    out["roofline"] = RooflineCost(resolve_model(model), spec, overhead_s=0.0)
    return out


def regime(p) -> str:
    if p.kind == "decode":
        return "decode, batch 1" if len(p.new_tokens) == 1 else "decode, batch 2+"
    return p.kind


def sweep_errors(passes, cost) -> dict:
    rel = np.array(logged_times(cost, passes)) / np.array([p.duration_s for p in passes]) - 1
    kinds = np.array([regime(p) for p in passes])
    return {k: (int((kinds == k).sum()), float(np.mean(np.abs(rel[kinds == k]))), float(np.median(rel[kinds == k])))
            for k in ("decode, batch 1", "decode, batch 2+", "prefill", "mixed") if (kinds == k).any()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-3.1-8b", help="the model whose own measurements are the truth")
    p.add_argument("--base", default="qwen2.5-1.5b", help="the calibrated model projected from")
    p.add_argument("--gpu", default="h200", help="GPU preset of the calibrations and the runs (default h200)")
    p.add_argument("--results", type=Path, default=Path("results"))
    args = p.parse_args(argv)
    spec = get_gpu(args.gpu)
    store = RunStore(args.results / "calibration")
    sweeps = [r for r in store.rows() if r.get("kind") == "sweep" and r.get("model") == args.model
              and r.get("gpu") == spec.name] if store.rows_path.exists() else []
    if not sweeps:
        print(f"error: no calibration sweep of {args.model} on {spec.name} under {store.root}", file=sys.stderr)
        return 2
    sweep = sweeps[-1]
    passes = store.passes(sweep["run_id"])
    models = costs(args.model, args.base, args.gpu)
    print(f"{args.model} on {spec.name}: sweep {sweep['run_id']} ({len(passes)} passes, card {sweep.get('gpu_uuid')})\n")
    print("| cost model | regime | passes | MAPE | signed median |\n|---|---|---|---|---|")
    for label, cost in models.items():
        for kind, (n, mape, med) in sweep_errors(passes, cost).items():
            print(f"| {label} | {kind} | {n} | {mape:.1%} | {med:+.1%} |")
    print("\nclosed runs of the continuous engine (median and worst over its runs; runs of one setup pooled)\n")
    print("| cost model | runs | TTFT error median | worst | ITL error median | worst |\n|---|---|---|---|---|---|")
    for label, cost in models.items():
        rows = [r for r in replay_runs(args.results, cost, spec.name, args.model) if "ttft_error" in r]
        if not rows:
            continue
        ttft, itl = np.array([r["ttft_error"] for r in rows]), np.array([r["itl_error"] for r in rows])
        print(f"| {label} | {len(rows)} | {np.median(ttft):+.1%} | {ttft[np.argmax(np.abs(ttft))]:+.1%} | "
              f"{np.median(itl):+.1%} | {itl[np.argmax(np.abs(itl))]:+.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
