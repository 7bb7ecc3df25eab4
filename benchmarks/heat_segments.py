"""A heat run's sequences against the heat model, sequence by sequence: each kind of pass's time
over its rested time (`calibrate.heat.rested_references`) and over the factor the heat model
gives it, for the heat fitted on the run itself (`calibrate.heat.fit_response`, its held-out
serving sequences included) and for a calibration file's heat.

    python benchmarks/heat_segments.py results/calibration-heat4
    python benchmarks/heat_segments.py results/calibration-heat4 --cost results/calibration/h200.json --bins
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibrate.heat import fit_response, rested_references  # noqa: E402
from core.runstore import RunStore  # noqa: E402
from sim.calibrated import CalibratedCost  # noqa: E402
from sim.heat import factors, levels  # noqa: E402

BINS = (0.0, 0.2, 0.35, 0.5, 0.7, 1.01)  # of the level h, for --bins


def kind_of(new_tokens) -> str:
    prompt, decode = any(n > 1 for n in new_tokens), any(n == 1 for n in new_tokens)
    return "mixed" if prompt and decode else "prompt" if prompt else "decode"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", help="a results folder holding calibration runs.jsonl with a heat run, or its calibration/ folder")
    p.add_argument("--run", default=None, help="the heat run's id (default: the latest heat run there)")
    p.add_argument("--cost", default="results/calibration/h200.json", help="the calibration whose heat is set beside")
    p.add_argument("--bins", action="store_true", help="also each held-out sequence by the fitted model's level h")
    args = p.parse_args(argv)
    root = Path(args.results)
    store = RunStore(root / "calibration" if (root / "calibration" / "runs.jsonl").exists() else root)
    heat_rows = [r for r in store.rows() if r.get("kind") == "heat" and (args.run is None or r["run_id"] == args.run)]
    if not heat_rows:
        print(f"error: no heat run in {store.root}", file=sys.stderr)
        return 2
    row = heat_rows[-1]
    passes, marks = store.passes(row["run_id"]), row["segments"]
    fitted, errors = fit_response(passes, marks)
    theirs = CalibratedCost.from_json(args.cost).heat
    ratio = np.array([q.duration_s for q in passes]) / rested_references(passes, marks)
    f_fit, f_cal = np.array(factors(passes, fitted)), np.array(factors(passes, theirs))
    h = np.array(levels(passes, fitted))
    kinds = np.array([kind_of(q.new_tokens) for q in passes])
    print(f"{row['run_id']} ({row.get('gpu')}, torch {row.get('torch')}, commit {row.get('git_commit')}): {len(passes)} passes")
    print(f"fitted on it: decode {fitted.decode:.1%}, prefill {fitted.prefill:.1%}, rise {fitted.rise_s * 1e3:.0f} ms, "
          f"fall {fitted.tau_s * 1e3:.0f} ms, full load {fitted.full_tokens} tokens, a decode beside a chunk as "
          f"{fitted.decode_weight:g}; " + ", ".join(f"{k} {v:+.2%}" if k.startswith("checked") else f"{k} {v:.2%}"
                                                      for k, v in errors.items()))
    print(f"{args.cost}: decode {theirs.decode:.1%}, prefill {theirs.prefill:.1%}, rise {theirs.rise_s * 1e3:.0f} ms, "
          f"fall {theirs.tau_s * 1e3:.0f} ms, full load {theirs.full_tokens} tokens, a decode as {theirs.decode_weight:g}")
    print(f"\n{'sequence':24s} {'passes':>7s} {'n':>5s} {'/rested':>8s} {'h':>5s} {'/fitted':>8s} {'/theirs':>8s}")
    for name in dict.fromkeys(m["segment"] for m in marks):
        idx = np.concatenate([np.arange(m["first"], m["last"] + 1) for m in marks if m["segment"] == name])
        for kind in ("prompt", "mixed", "decode"):
            s = idx[kinds[idx] == kind]
            if len(s):
                print(f"{name:24s} {kind:>7s} {len(s):5d} {ratio[s].mean() - 1:+8.2%} {h[s].mean():5.2f} "
                      f"{np.mean(ratio[s] / f_fit[s]) - 1:+8.2%} {np.mean(ratio[s] / f_cal[s]) - 1:+8.2%}")
    if args.bins:
        print("\nthe held-out sequences by level h (time over rested time, over the factor of each heat)")
        checked = {m["segment"] for m in marks if m["segment"].startswith("serving")}
        for name in sorted(checked):
            idx = np.concatenate([np.arange(m["first"], m["last"] + 1) for m in marks if m["segment"] == name])
            for kind in ("prompt", "mixed", "decode"):
                for lo, hi in zip(BINS, BINS[1:]):
                    s = idx[(kinds[idx] == kind) & (h[idx] >= lo) & (h[idx] < hi)]
                    if len(s) > 5:
                        print(f"{name:24s} {kind:>7s} h {lo:.2f}-{min(hi, 1):.2f} {len(s):5d} {ratio[s].mean() - 1:+8.2%} "
                              f"{np.mean(ratio[s] / f_fit[s]) - 1:+8.2%} {np.mean(ratio[s] / f_cal[s]) - 1:+8.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
