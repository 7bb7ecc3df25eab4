"""The engine's host time, measured from the committed pass logs: `python -m calibrate.host`.

`sim.host.HostTime` delays a pass that an idle engine plans (nothing in flight) by
`max(fixed_s, per_token_s * tokens) (+ wake_s after a sleep)`, and `retire_s` is how long after a
pass ends the engine's next plan still sees arrivals. Measured here on the continuous engine's
records under results/ (one replica, overlap on):

- per_token_s: the slope of the logged host time (`PassRecord.host_s`, planning and building a
  pass) over the tokens of the idle-start passes, closed runs of 16 to 65,536 prompt tokens
  included; cost-model free.
- fixed_s: the median over passes planned with nothing in flight and no sleep (every run's
  first pass) of (end - planned - predicted): planned at 0, the cost
  model's `predicted` GPU time; what is left is the host's planning, the launch the GPU waited
  for, and a cold GPU's first kernels. Passes past 8,192 tokens (no CUDA graph, where the cost
  model itself is off by 10% and more) are left out. It is never less than the median time from
  planned to the pass's start, which the logs show the host took: where first passes are long
  (an 8B model's prompts take tens of ms), the cost model's own error on them (a few percent) can
  outweigh the host's part and leave the median below that, even below 0.
- wake_s: the same median over passes an open run's engine planned after sleeping (a request
  arrived after the previous pass ended and before this one began), planned at that arrival,
  less max(fixed_s, per_token_s * tokens).
- retire_s: among requests of the continuous policy's unsaturated runs that arrived while a
  pass ran, from the end of the pass before it: the lag that best splits those that joined the
  next pass from those that joined the one after (overlap plans a pass while the previous one
  runs, after reading the pass before that one).
- launch_s, eager_launch_s: the median of a pass's logged planning and launch time (`host_s +
  launch_s`), over the passes replayed as CUDA graphs and over those of more than graph_tokens
  tokens (the largest prefill graph's, from the calibration), launched kernel by kernel: the
  host plans its next pass only after that.

    python -m calibrate.host                       # print the figures
    python -m calibrate.host --write sim/calibrations/qwen2.5-1.5b/h200.json   # store them as its "host"
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.atomic import write_text
from core.cli import ArgumentParser
from core.jsontext import dumps
from calibrate.replay import engine_runs
from sim.noise import robust_sigma

MAX_GRAPH_TOKENS = 8192  # passes up to this many tokens run as CUDA graphs, where the cost model holds


@dataclass
class IdleStart:
    tokens: int
    host_s: float       # logged planning time
    late_s: float       # end - planned - predicted
    woke: bool          # the engine slept before planning it
    started_s: float = 0.0  # start - planned: the host's time before the GPU began the pass


def idle_starts(rows_passes_requests, cost) -> list[IdleStart]:
    """Passes planned with nothing in flight: each run's first (planned at 0), and in open runs
    those an arrival woke the engine for (planned at that arrival): the pass after an arrival that
    came while the GPU was idle, when it takes in a new prompt (one that does not was planned
    before the arrival, with the engine awake)."""
    out = []
    for row, passes, requests in rows_passes_requests:
        if not passes:
            continue
        arrivals = np.sort([r.arrival_s for r in requests])
        starts = np.array([p.start_s for p in passes])
        ends = starts + np.array([p.duration_s for p in passes])
        for i, p in enumerate(passes):
            if i == 0:
                planned, woke = 0.0, False
            else:
                j = np.searchsorted(arrivals, ends[i - 1], side="right")
                if j >= len(arrivals) or arrivals[j] > starts[i] or not takes_in_a_prompt(p):
                    continue
                planned, woke = float(arrivals[j]), True
            tokens = sum(p.new_tokens)
            late = ends[i] - planned - cost.pass_time(p.new_tokens, p.context_lens)
            out.append(IdleStart(tokens, p.host_s, float(late), woke, float(starts[i] - planned)))
    return out


def fixed_time(cold: list[IdleStart]) -> float:
    """fixed_s from the first passes: the median of end - planned - predicted, but no less than
    the median of start - planned (the host's own time before the GPU began, in the logs)."""
    return max(float(np.median([s.late_s for s in cold])), float(np.median([s.started_s for s in cold])))


def takes_in_a_prompt(p) -> bool:
    """The pass starts a prompt: a sequence with no cached context puts several tokens through."""
    return any(c == 0 and n > 1 for n, c in zip(p.new_tokens, p.context_lens))


def joins(rows_passes_requests) -> list[tuple[float, bool]]:
    """(arrival - end of the pass before the one in flight, joined the next pass) for requests of
    the continuous policy, unsaturated, that arrived while a pass ran."""
    out = []
    for row, passes, requests in rows_passes_requests:
        if row.get("policy") != "continuous" or row.get("median_ttft_ms", 0) > 250 or len(passes) < 2:
            continue
        starts = np.array([p.start_s for p in passes])
        ends = starts + np.array([p.duration_s for p in passes])
        taken = set()
        for r in sorted(requests, key=lambda r: r.arrival_s):
            i = int(np.searchsorted(ends, r.arrival_s))
            if i == 0 or i >= len(passes) or starts[i] > r.arrival_s:
                continue  # before the first pass, or the engine was idle
            for j in range(i + 1, min(i + 4, len(passes))):
                k = next((k for k, (n, c) in enumerate(zip(passes[j].new_tokens, passes[j].context_lens))
                          if c == 0 and n == r.prompt_tokens and (j, k) not in taken), None)
                if k is not None:
                    taken.add((j, k))
                    out.append((float(r.arrival_s - ends[i - 1]), j == i + 1))
                    break
    return out


def best_split(points: list[tuple[float, bool]], window_s: float = 200e-6) -> float:
    """The lag t minimising the requests put on the wrong side: joined the next pass though they
    arrived after t, or missed it though they arrived before t (offsets within `window_s`)."""
    near = sorted(p for p in points if 0 <= p[0] < window_s)
    if not near:
        raise ValueError("no request arrived just after a pass ended: nothing to measure retire_s on")
    candidates = [0.0] + [d for d, _ in near]
    wrong = [sum(1 for d, nxt in near if (d < t and not nxt) or (d >= t and nxt)) for t in candidates]
    return float(candidates[int(np.argmin(wrong))])


def measure(results: Path, cost, gpu: str, model: str, only: dict | None = None) -> tuple[dict, dict, dict]:
    """The host terms (seconds), their scatter (`sim.noise.Noise`'s host sigmas: the robust log
    standard deviation of the idle starts' end - planned - predicted, and of the graph and eager
    launches) and what they were measured on."""
    runs = [(row, store.passes(row["run_id"]), store.requests(row["run_id"]))
            for store, row in engine_runs(results, gpu, model, only)
            if (row.get("replicas") or 1) == 1 and row.get("overlap", True)]
    if not runs:
        raise ValueError(f"no single-replica runs of {model} on {gpu} under {results}/continuous*")
    starts = idle_starts(runs, cost)
    tokens = np.array([s.tokens for s in starts], float)
    if len(set(tokens)) < 2:
        raise ValueError(f"{len(starts)} passes planned on an idle engine, of {len(set(tokens))} sizes: too few to "
                         "measure the host's time by a pass's tokens")
    host = np.array([s.host_s for s in starts])
    per_token = float(np.polyfit(tokens, host, 1)[0])
    small = [s for s in starts if s.tokens <= MAX_GRAPH_TOKENS]
    cold = [s for s in small if not s.woke]
    if not cold or not any(s.woke for s in small):
        raise ValueError("need both first passes and passes after a sleep to measure fixed_s and wake_s")
    fixed = fixed_time(cold)
    woke = [s.late_s - max(fixed, per_token * s.tokens) for s in small if s.woke]
    wake = max(0.0, float(np.median(woke)))
    points = joins(runs)
    retire = best_split(points)
    graph_tokens = max(getattr(cost, "token_buckets", None) or [0])
    launches = {True: [], False: []}  # eager or not: host_s + launch_s
    for _, passes, _ in runs:
        for p in passes:
            if p.launch_s is not None and p.host_s is not None:
                launches[bool(graph_tokens) and sum(p.new_tokens) > graph_tokens].append(p.host_s + p.launch_s)
    if not launches[False]:
        raise ValueError("the pass logs record no launch times (launch_s): re-run the open runs with a newer engine")
    terms = {"fixed_s": fixed, "per_token_s": max(0.0, per_token), "wake_s": wake, "retire_s": retire,
             "launch_s": float(np.median(launches[False])),
             "eager_launch_s": float(np.median(launches[True])) if launches[True] else 0.0,
             "graph_tokens": int(graph_tokens)}
    sigmas = {"idle_sigma": robust_sigma([s.late_s for s in small]), "launch_sigma": robust_sigma(launches[False]),
              "eager_launch_sigma": robust_sigma(launches[True])}
    basis = {"runs": len(runs), "first_passes": len(cold), "passes_after_sleep": len(woke),
             "idle_starts_for_slope": len(starts), "joins_near_a_pass_end": sum(1 for d, _ in points if 0 <= d < 200e-6),
             "graph_launches": len(launches[False]), "eager_launches": len(launches[True])}
    return terms, sigmas, basis


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m calibrate.host", description="Measure the continuous engine's host time "
                                                                     "from its committed pass logs.")
    p.add_argument("--results", default="results", help="the results directory (default results)")
    p.add_argument("--calibration", default="sim/calibrations/qwen2.5-1.5b/h200.json",
                   help="the calibration file whose cost model prices the passes (default sim/calibrations/qwen2.5-1.5b/h200.json)")
    p.add_argument("--write", action="store_true", help="store the figures as the calibration file's \"host\"")
    args = p.parse_args(argv)
    from sim.cost import CalibratedCost
    try:
        cost = CalibratedCost.from_json(args.calibration)
        terms, sigmas, basis = measure(Path(args.results), cost, cost.gpu, cost.model)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for k, v in terms.items():
        print(f"{k:14s} {v:10d} tokens" if k == "graph_tokens" else
              f"{k:14s} {v * 1e9:10.3f} ns" if k == "per_token_s" else f"{k:14s} {v * 1e6:10.3f} us")
    print("scatter (robust sigma of the log): " + ", ".join(f"{k} {v:.3f}" for k, v in sigmas.items()))
    print("measured on " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in basis.items()))
    if args.write:
        path = Path(args.calibration)
        d = json.loads(path.read_text())
        d["host"] = terms
        d["noise"] = (d.get("noise") or {}) | sigmas
        write_text(path, dumps(d, indent=1) + "\n")
        print(f"wrote \"host\" and the host's \"noise\" into {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
