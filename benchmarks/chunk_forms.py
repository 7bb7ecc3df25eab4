"""Chunk attention's form, tried on served prompt and mixed passes: the calibration's waves against
the kernel's programs list-scheduled in launch order, each fitted on the calibration sweep's
passes alone and priced on open runs' passes timed again (`benchmarks/replay_shapes.py --json`).

- `waves` (`sim.calibrated`'s form for prompt passes, and for mixed ones without `--mixed`): the
  prefill regime's parameters as the calibration file holds them: a pass's tiles in waves of the
  SMs, each wave a mean tile's walk (`shared` of it past the first), never shorter than the
  longest tile;
- `list`: the chunk-attention kernel's programs (`engine/kernels/prefill_attention.py`: a tile of
  `tile_tokens` tokens of one sequence, decode rows a tile each, a sequence's tiles last first,
  one KV head's tiles then the next's) over `prefill_wave` resident slots, each taking
  (blocks + r) * block_s, the next starting as one ends (`sim.schedule.makespan`, no bandwidth
  shared); with the regime's fixed time, weights or projections and per-sequence time, fitted by
  the same soft_l1 least squares for each start r of a grid (at the best r, the committed
  calibration's `mixed` form: `python -m calibrate fit --mixed` fits it so and prices mixed
  passes by it);
- `joint`: the waves for passes of prompt tokens alone and the list schedule (a block time of its
  own) for mixed passes, the rest of the regime shared, fitted together the same way.

Both on the sweep's passes of prompt tokens run as CUDA graphs (up to 8,192 tokens), their times
rested by the calibration's heat factor; the replays' windowed column ("sweep, own order", the
sweep's own way of timing) rested by heat along its own timeline (`replay_priced.own_heat`).

    python benchmarks/chunk_forms.py [REPLAY ...] [--calibration FILE] [--starts 0,2,5,10]

(default: every replay-*.json.gz under results/calibration-replays/ that records its columns'
spans; about 10 s)
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from calibrate.fit import ROBUST_SCALE  # noqa: E402
from core.runstore import RunStore  # noqa: E402
from replay_priced import own_heat  # noqa: E402
from sim.calibrated import CalibratedCost, bucket  # noqa: E402
from sim.heat import factors  # noqa: E402
from sim.schedule import chunk_tile_runs, makespan  # noqa: E402

COLUMN = "sweep, own order"
LIST_PARAMS = ("fixed_s", "weight_gbs", "matmul_tflops", "per_seq_s", "block_s")
JOINT_PARAMS = LIST_PARAMS + ("program_s", "shared", "list_block_s")


def sweep_passes(cost, sweep: str) -> list[tuple]:
    """(new tokens, contexts, rested seconds, kind) of the sweep's prompt and mixed passes run as graphs."""
    store = RunStore(ROOT / "results" / "calibration")
    passes = store.passes(sweep)
    heat = factors(passes, cost.heat)
    return [(p.new_tokens, p.context_lens, p.duration_s / f, p.kind) for p, f in zip(passes, heat)
            if p.kind != "decode" and sum(p.new_tokens) <= cost.token_buckets[-1]]


def replay_passes(cost, files: list[Path]) -> dict[str, list[tuple]]:
    """Per replay file, the same of its re-timed prompt and mixed passes (windowed, rested)."""
    out = {}
    for f in files:
        with gzip.open(f, "rt") if f.suffix == ".gz" else open(f) as fh:
            d = json.load(fh)
        if COLUMN not in d["passes"][0] or COLUMN not in d.get("spans", {}):
            continue
        ps = d["passes"]
        ms = np.array([q[COLUMN] for q in ps])
        heat = own_heat(cost, ps, COLUMN, d["spans"][COLUMN], ms)
        out[d["run"]] = [(q["new_tokens"], q["context_lens"], t / 1e3 / h, q["kind"]) for q, t, h in zip(ps, ms, heat)
                         if q["kind"] != "decode" and sum(q["new_tokens"]) <= cost.token_buckets[-1]]
    return out


class Forms:
    """The passes' terms, vectorised: the list schedule's walk (in blocks' time, for each start r)
    and the waves' counts (`CalibratedCost.chunk_waves`)."""

    def __init__(self, cost, items: list[tuple], starts: list[float]):
        self.c = {"w": cost.weight_bytes, "f": cost.flops_per_token}
        self.m = np.array([bucket(sum(n), cost.token_buckets) for n, *_ in items], float)
        self.seqs = np.array([len(n) for n, *_ in items], float)
        self.mixed = np.array([k == "mixed" for *_, k in items])
        self.walk = np.array([[makespan(chunk_tile_runs(n, c, cost.tile_tokens, cost.block_n, cost.kv_heads), 1e30, 1.0, r,
                                        cost.prefill_wave) for r in starts] for n, c, *_ in items])
        self.P, self.work, self.crit, self.waves = np.array([cost.chunk_waves(n, c) for n, c, *_ in items], float).T

    def rest(self, fixed, wgbs, tflops, per_seq) -> np.ndarray:
        weights = self.c["w"] / (wgbs * 1e9)
        return fixed + np.maximum(weights, self.m * self.c["f"] / (tflops * 1e12)) + self.seqs * per_seq

    def list_form(self, theta: np.ndarray, j: int) -> np.ndarray:
        fixed, wgbs, tflops, per_seq, block = np.exp(theta)
        return self.rest(fixed, wgbs, tflops, per_seq) + block * self.walk[:, j]

    def joint(self, theta: np.ndarray, j: int) -> np.ndarray:
        """The waves for prompt passes, the list schedule (its own block time) for mixed ones."""
        fixed, wgbs, tflops, per_seq, block, program, shared, list_block = np.exp(theta)
        waves = np.maximum(self.crit * block + program,
                           self.waves * np.where(self.waves > 1, shared, 1.0) * (self.work / self.P * block + program))
        return self.rest(fixed, wgbs, tflops, per_seq) + np.where(self.mixed, list_block * self.walk[:, j], waves)


def summary(pred: np.ndarray, items: list[tuple]) -> str:
    err = pred / np.array([t for _, _, t, _ in items]) - 1
    mixed = np.array([k == "mixed" for *_, k in items])
    parts = []
    for name, sel in (("prompts", ~mixed), ("mixed", mixed)):
        if sel.any():
            parts.append(f"{name} {sel.sum():>4} MAPE {np.mean(np.abs(err[sel])):5.2%} median {np.median(err[sel]):+6.2%}")
    return " | ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--calibration", type=Path, default=ROOT / "results" / "calibration" / "h200.json",
                    help="the calibration file: its parameters (waves) and its sweep (both forms' fit)")
    ap.add_argument("--starts", default="0,2,5,10", help="a program's start, in blocks' time (r)")
    args = ap.parse_args(argv)
    doc = json.loads(args.calibration.read_text())
    doc["parameters"].pop("mixed", None)  # (every prompt and mixed pass by the waves, the forms set beside them)
    cost, sweep = CalibratedCost(doc, str(args.calibration)), doc["sweep"]
    files = args.files or sorted((ROOT / "results" / "calibration-replays").glob("replay-*.json.gz"))
    train = sweep_passes(cost, sweep)
    held = replay_passes(cost, files)
    if not held:
        print("error: no replay file with the windowed column's span", file=sys.stderr)
        return 2
    starts = [float(s) for s in args.starts.split(",")]
    print(f"fitted on sweep {sweep}'s {len(train)} prompt and mixed passes run as graphs (rested); priced on "
          f"{sum(map(len, held.values()))} passes of {len(held)} runs timed again ({COLUMN!r}, rested)")

    def show(name: str, price) -> None:
        print(f"{name}\n  sweep (fitted)          {summary(price(train), train)}")
        for run, items in held.items():
            print(f"  {run[:40]:<40}  {summary(price(items), items)}")

    show("waves (the calibration's parameters)",
         lambda items: np.array([cost.pass_time(n, c) for n, c, *_ in items]))
    form = Forms(cost, train, starts)
    forms = {id(train): form, **{id(items): Forms(cost, items, starts) for items in held.values()}}
    p = cost.pp
    rest0 = [p["fixed_s"], p["weight_gbs"], p["matmul_tflops"], p["per_seq_s"]]
    seconds = np.array([t for _, _, t, _ in train])
    for name, theta0, names in (("list", rest0 + [p["block_s"]], LIST_PARAMS),
                                ("joint", rest0 + [p["block_s"], p["program_s"], p["shared"], p["block_s"]], JOINT_PARAMS)):
        for j, r in enumerate(starts):
            fit = least_squares(lambda th: getattr(form, f"{name}_form" if name == "list" else name)(th, j) / seconds - 1,
                                np.log(theta0), method="trf", loss="soft_l1", f_scale=ROBUST_SCALE, max_nfev=4000)
            values = ", ".join(f"{k} {v:.4g}" for k, v in zip(names, np.exp(fit.x)))
            show(f"{name}, start r={r:g} ({values})",
                 lambda items: getattr(forms[id(items)], f"{name}_form" if name == "list" else name)(fit.x, j))
    return 0


if __name__ == "__main__":
    sys.exit(main())
