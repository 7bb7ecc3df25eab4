"""Candidate decode-attention forms fitted to the committed attention-alone timings
(`benchmarks/attention_mixtures.py --json`, in results/calibration-replays/): how close each comes
to the kernel's time on served and designed mixtures of contexts, and to one context of their mean.

- `counts`: a + b * programs + c * blocks + d * merged slices (least squares on relative error),
  every count summed over the batch's sequences, as a closed form could;
- `schedule`: the kernel's programs in launch order (slice index, then KV head, then sequence)
  list-scheduled over R resident programs, each taking start + blocks * block (+ merge * slices for
  the last slice of a sequence cut in several), one past a sequence's end `dead`; the four times
  fitted for each R of a grid, apart for batches that fill the GPU and those that do not (the
  kernel slices them differently);
- `fluid`: the same programs in the same order over R resident, every running program walking its
  blocks at an equal share of the KV bandwidth but no faster than one block per `block` (a
  program's start counted as blocks of that pace), plus a fixed time: the kernel's makespan when
  it is bandwidth-bound while many programs run and latency-bound in its tail; the bandwidth,
  block, start and fixed time fitted for each R, apart for the two slicings.

    python benchmarks/attention_forms.py [FILE ...] [--resident 396,528] [--held-out FILE ...]
        [--slicing both|small|big] [--forms counts,schedule,fluid]

(default: every attention-mixtures-*.json.gz under results/calibration-replays/; the schedule's fit
takes about a minute and a half a resident count on two cores, the fluid's on batches that fill
the GPU about fifteen seconds; `--held-out`: timings the forms are not fitted on, priced apart)
"""
from __future__ import annotations

import argparse
import gzip
import heapq
import json
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.config import get_preset  # noqa: E402
from sim.cost import parse_cost  # noqa: E402
from sim.schedule import makespan as makespan_shared  # noqa: E402

# the kernel's slicing as the calibration records it (`decode_attention`: KV heads, block_n, slices)
COST, _ = parse_cost("calibrated:h200")
BLOCK_N, KV_HEADS = COST.block_n, COST.kv_heads
LAYERS = get_preset(COST.model).num_hidden_layers  # the timings are a layer's; COST.block_bytes every layer's


def load(files: list[Path]) -> list[tuple[np.ndarray, float, str]]:
    """(lengths with the new token, us a layer, group) of every timing: each batch as timed and
    its twin of one context of the mean."""
    out = []
    for f in files:
        with gzip.open(f, "rt") if f.suffix == ".gz" else open(f) as fh:
            d = json.load(fh)
        for r in d["passes"]:
            ctx = r["contexts"]
            group = "designed" if r["file"].startswith("designed") else r["file"].split("-2026")[0].removeprefix("replay-")
            out.append((np.array(ctx) + 1, r["served"], f"{group}, as timed"))
            out.append((np.full(len(ctx), round(sum(ctx) / len(ctx)) + 1), r["uniform"], f"{group}, one context"))
    return out


def slices(L: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(positions a slice, live slices) of each sequence, and the grid's slices a sequence."""
    big = fills(L)
    sl = np.array([COST.slice_of(int(n), big)[0] for n in L], dtype=float)
    return sl, np.ceil(L / sl).astype(int), COST.slicing[big][0]


def fills(L: np.ndarray) -> bool:
    """Whether a batch of these contexts fills the GPU (the kernel's second slicing)."""
    return len(L) * KV_HEADS >= COST.fills_gpu


def counts(L: np.ndarray) -> list[float]:
    sl, live, _ = slices(L)
    return [1.0, KV_HEADS * live.sum(), KV_HEADS * np.ceil(L / BLOCK_N).sum(), KV_HEADS * (live * (live > 1)).sum()]


def programs(L: np.ndarray) -> list[tuple[float, int]]:
    """(blocks, slices merged by it) of every program in launch order (0 blocks: past the end)."""
    sl, live, most = slices(L)
    out = []
    for s in range(most):
        for _ in range(KV_HEADS):
            for b in range(len(L)):
                if s < live[b]:
                    out.append((np.ceil(min(sl[b], L[b] - s * sl[b]) / BLOCK_N), live[b] if s == live[b] - 1 and live[b] > 1 else 0))
                else:
                    out.append((0.0, 0))
    return out


def makespan(progs, block: float, start: float, merge: float, dead: float, resident: int) -> float:
    slots = [0.0] * resident
    end = 0.0
    for blocks, merged in progs:
        t = heapq.heappop(slots) + (dead if not blocks else start + blocks * block + merge * merged)
        end = max(end, t)
        heapq.heappush(slots, t)
    return end


def fluid(progs, bandwidth: float, block: float, start: float, resident: int) -> float:
    """The makespan of `progs` (blocks, merged) in launch order over `resident` slots, processor
    sharing: n running programs each walk min(1 / block, bandwidth / n) blocks a microsecond; a
    program's start costs start / block blocks; programs past a sequence's end are left out."""
    runs: list[list] = []
    for blocks, _ in progs:
        if blocks:
            if runs and runs[-1][0] == blocks:
                runs[-1][1] += 1
            else:
                runs.append([blocks, 1])
    return makespan_shared(runs, bandwidth, block, start, resident)


def report(name: str, data, predicted: np.ndarray) -> None:
    rel = predicted / np.array([t for _, t, _ in data]) - 1
    groups = sorted({g for _, _, g in data})
    print(f"{name}: MAPE {np.mean(np.abs(rel)):.2%}, worst {np.max(np.abs(rel)):.1%}")
    for g in groups:
        sel = np.array([x[2] == g for x in data])
        print(f"  {g:<40}{sel.sum():>5}  mean {np.mean(rel[sel]):+.1%}  MAPE {np.mean(np.abs(rel[sel])):.1%}")


# the list-scheduled forms: (a program list's time for times theta over R resident, their start, what
# they are, least squares' evaluations)
TIMED = {
    "schedule": (lambda progs, th, R: makespan(progs, *th, R), [2.0, 2.0, 0.5, 0.05],
                 lambda th: f"a block {th[0]:.3f}, a program's start {th[1]:.3f}, a merged slice {th[2]:.3f}, "
                            f"past the end {th[3]:.3f}", 60),
    "fluid": (lambda progs, th, R: fluid(progs, *th[:3], R) + th[3], [140.0, 2.0, 1.5, 8.0],
              lambda th: f"{th[0]:.1f} blocks a us shared ({th[0] * COST.block_bytes / LAYERS / 1e6:.2f} TB/s), "
                         f"a block {th[1]:.3f}, a program's start {th[2]:.3f}, fixed {th[3]:.2f}", 200),
}


def fit_timed(form: str, data, R: int):
    """`form`'s times fitted on `data` apart for the two slicings: (a predictor of a list of
    timings' microseconds, what was fitted)."""
    time, start, say, evaluations = TIMED[form]
    t = np.array([x[1] for x in data])
    progs = [programs(L) for L, _, _ in data]
    big = np.array([fills(L) for L, _, _ in data])
    thetas, said = {}, []
    for regime in (False, True):  # the two slicings, each its own times (as the cost model's rates)
        idx = np.flatnonzero(big == regime)
        if not len(idx):
            continue

        def residuals(theta, idx=idx):
            return np.array([time(progs[i], np.exp(theta), R) for i in idx]) / t[idx] - 1
        thetas[regime] = np.exp(least_squares(residuals, np.log(start), max_nfev=evaluations).x)
        said.append(f"{'big' if regime else 'small'} batches: {say(thetas[regime])}")

    def predict(rows):
        return np.array([time(programs(L), thetas[fills(L)], R) for L, _, _ in rows])
    return predict, "; ".join(said)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--resident", default="396,528", help="resident programs to try for the schedule (default 396,528)")
    ap.add_argument("--held-out", nargs="+", type=Path, default=[],
                    help="timings the forms are not fitted on, reported apart")
    ap.add_argument("--slicing", choices=("both", "small", "big"), default="both",
                    help="only batches of this slicing (big: those that fill the GPU)")
    ap.add_argument("--forms", default="counts,schedule,fluid", help="which forms (default all three)")
    args = ap.parse_args(argv)
    files = args.files or sorted((ROOT / "results" / "calibration-replays").glob("attention-mixtures-*.json.gz"))
    missing = [f for f in files + args.held_out if not f.is_file()]
    if not files or missing:
        print(f"error: no attention-alone timings{' at ' + str(missing[0]) if missing else ''}", file=sys.stderr)
        return 2
    try:
        resident = [int(x) for x in args.resident.split(",")]
    except ValueError:
        print(f"error: --resident {args.resident!r}: whole numbers, comma-separated", file=sys.stderr)
        return 2
    forms = args.forms.split(",")
    unknown = sorted(set(forms) - {"counts", *TIMED})
    if unknown:
        print(f"error: --forms: unknown {unknown}; known: counts, {', '.join(TIMED)}", file=sys.stderr)
        return 2
    keep = {"both": lambda L: True, "small": lambda L: not fills(L), "big": fills}[args.slicing]
    data = [x for x in load(files) if keep(x[0])]
    held = [x for x in load(args.held_out) if keep(x[0])]
    print(f"{len(data)} timings from {', '.join(f.name for f in files)}"
          + (f"; held out: {len(held)} from {', '.join(f.name for f in args.held_out)}" if held else ""))

    def show(name, predict):
        report(name, data, predict(data))
        if held:
            report(f"{name}, held out", held, predict(held))

    if "counts" in forms:
        t = np.array([x[1] for x in data])
        F = np.array([counts(L) for L, _, _ in data])
        coef = np.linalg.lstsq(F / t[:, None], np.ones(len(t)), rcond=None)[0]
        show("counts (us: " + ", ".join(f"{n} {c:.4g}" for n, c in zip(("fixed", "a program", "a block",
                                                                       "a merged slice"), coef)) + ")",
             lambda rows: np.array([counts(L) for L, _, _ in rows]) @ coef)
    for form in (f for f in TIMED if f in forms):
        for R in resident:
            predict, said = fit_timed(form, data, R)
            show(f"{form} over {R} resident (us; {said})", predict)
    return 0


if __name__ == "__main__":
    sys.exit(main())
