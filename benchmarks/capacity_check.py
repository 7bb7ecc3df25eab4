"""The simulator's capacity answer against the engine's: one trace window served by the real engine at
several rate scales (`benchmarks/gpu_open_runs.sh capacity`), each run simulated on its own arrivals,
and the simulator's capacity search (`python -m sim capacity --search rate-scale`, with the runs' limits
and overlap mode) on the same window.

Prints, per setup (policy, replicas and router), card (the GPU UUID the row names, else the runs
at one commit started close together: `sim.card.cards`) and scale, the SLO metrics real and simulated, whether each side meets the SLOs, and the
run's passes priced by the cost model against their logged times (how fast that GPU ran as the
model sees it); then, per setup, the simulator's answer (its highest scale that meets, and the
nearest that fails) with the cost model as calibrated and with every pass 2% shorter and longer
(`--cost-error`: the validation's band, `sim compare --cost-error`; how far the answer moves when
a card or a load runs the passes that much off their price) and, per card, the scales between
which the engine stops meeting them; with --card-offset, also the simulator's answer for that card:
every pass as much longer as the card's runs of the other setups took over their price
(`sim.card.run_offset`; held out from the runs it is judged against). The runs of a setup must serve
one window (the search runs on the first one's arrivals).

    python benchmarks/capacity_check.py                 # the azure-cap runs under results/continuous (about a minute)
    python benchmarks/capacity_check.py --repeats       # and those under results/continuous-repeats (other cards)
    python benchmarks/capacity_check.py --repeats --card-offset   # and each card's answer with its offset
    python benchmarks/capacity_check.py --prefix azure-cap --slo ttft:p99:200 tpot:p99:20 --cost-error 0.02
"""
from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.metrics import compute_metrics  # noqa: E402
from core.runstore import RunStore  # noqa: E402
from sim.capacity import parse_slos  # noqa: E402
from sim.card import cards, run_offset  # noqa: E402
from sim.compare import DEFAULT_REPEATS, engine_runs, load_cost, repeat_runs, simulate_like, trace_of  # noqa: E402
from traces.io import save_trace  # noqa: E402
from traces.trace import Trace  # noqa: E402


def window_at_1x(row: dict, requests) -> Trace:
    """The run's arrivals at the trace's own rate (the engine served them `rate_scale` times faster)."""
    trace = trace_of(requests, row["run_id"])
    trace.arrival_s = trace.arrival_s * float(row["rate_scale"])
    return trace


def card_labels(rows: list[dict]) -> list[str]:
    """Each row's card (`sim.card.cards`) as a short label: a UUID's first 12 characters (GPU- and
    8 hex digits), or the commit of runs started close together (#2, #3 for later groups at one commit)."""
    keys = cards(rows)
    short: dict[str, str] = {}
    for row, key in zip(rows, keys):
        if key not in short:
            base = key[:12] if key.startswith("GPU-") else row["git_commit"][:7]
            seen = sum(label.split("#")[0] == base for label in short.values())
            short[key] = base + (f"#{seen + 1}" if seen else "")
    return [short[key] for key in keys]


def agrees(answer: float, met: list[float], failed: list[float]) -> bool:
    """Whether a capacity answer (the highest scale that meets) fits what a card did: no scale it
    met above the answer, none it missed at or below it."""
    return all(m <= answer for m in met) and all(f > answer for f in failed)


def setup(row: dict) -> str:
    """The run's policy, and its replicas and router when there are several."""
    replicas = row.get("replicas") or 1
    return row["policy"] + (f", {replicas} replicas, {row['router']}" if replicas > 1 else "")


def simulated_capacity(trace_path: Path, row: dict, slos: list[str], costs: list[str]) -> list[dict]:
    """`python -m sim capacity --search rate-scale` on the window, with the run's policy, replicas,
    router and limits and, as the engine ran, its overlap mode (each pass planned while the one
    before it runs): one search per cost model, side by side."""
    with tempfile.TemporaryDirectory() as out:
        limits = {"--policy": row["policy"], "--replicas": row.get("replicas") or 1,
                  "--router": row.get("router") or "round-robin", "--kv-blocks": row["kv_blocks"],
                  "--max-num-seqs": row["max_num_seqs"], "--max-num-batched-tokens": row["max_num_batched_tokens"],
                  "--max-model-len": row["max_model_len"], "--block-size": row["block_size"]}
        cmd = [sys.executable, "-m", "sim", "capacity", "--trace", str(trace_path), "--search", "rate-scale",
               "--slo", *slos, "--cost", ",".join(costs), *(x for k, v in limits.items() for x in (k, str(v))),
               *(["--overlap"] if row.get("overlap") else []), "--out", out]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"python -m sim capacity failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        with open(Path(out) / "capacity.csv") as f:
            rows = list(csv.DictReader(f))
        return rows if "cost" in rows[0] else [dict(r, cost=costs[0]) for r in rows]  # (one cost: not a column)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=ROOT / "results", help="results directory (default results/)")
    ap.add_argument("--prefix", default="azure-cap", help="the runs whose id starts with this (default azure-cap)")
    ap.add_argument("--slo", nargs="+", default=["ttft:p99:200", "tpot:p99:20"], help="NAME:STAT:MS ...")
    ap.add_argument("--cost", default="calibrated:h200")
    ap.add_argument("--repeats", action="store_true",
                    help="also the runs of the same prefix under results/continuous-repeats (more cards)")
    ap.add_argument("--cost-error", type=float, default=0.02,
                    help="search again with every pass this much shorter and longer (default 0.02; 0: not)")
    ap.add_argument("--card-offset", action="store_true",
                    help="search again for each card with its offset, measured on its runs of the other setups")
    args = ap.parse_args(argv)
    if not 0 <= args.cost_error < 1:
        ap.error(f"--cost-error must be from 0 to below 1, got {args.cost_error}")
    costs = [args.cost] + ([f"{args.cost}*{1 - args.cost_error:g}", f"{args.cost}*{1 + args.cost_error:g}"]
                           if args.cost_error else [])
    try:
        slos = parse_slos(args.slo)
    except ValueError as e:
        ap.error(str(e))
    stores = {"continuous": RunStore(args.results / "continuous")}
    rows = [r for r in engine_runs(args.results) if r["run_id"].startswith(args.prefix)]
    if not rows:
        print(f"no open runs starting with {args.prefix!r} under {args.results / 'continuous'}", file=sys.stderr)
        return 1
    if args.repeats:  # the same window served again, on other cards too
        for r, store in repeat_runs(args.results, DEFAULT_REPEATS):
            if r["run_id"].startswith(args.prefix):
                stores[store.root.name] = store
                rows.append(dict(r, store=store.root.name))
    for row, card in zip(rows, card_labels(rows)):
        row["card"] = card
    by_setup = defaultdict(list)
    for row in sorted(rows, key=lambda r: (r.get("replicas") or 1, setup(r), r["time"], float(r["rate_scale"]))):
        by_setup[setup(row)].append(row)
    try:
        cost = load_cost(args.cost, rows[0]["model"])
    except ValueError as e:
        ap.error(str(e))
    offsets = defaultdict(list)  # (card, setup): its runs' measured over priced pass time
    names = [f"{s.stat} {s.metric}" for s in slos]
    width = max(len(name) for name in by_setup)
    print(f"{'setup':>{width}} {'card':>12} {'scale':>6}  " + "  ".join(f"{n + ' real':>13} {'sim':>8}" for n in names)
          + f"  {'real meets':>10} {'sim meets':>9} {'passes priced':>13}")
    searched = []  # per setup: its runs, the window, and the scales each card met and failed at
    for name, runs in by_setup.items():
        met, failed = defaultdict(list), defaultdict(list)  # by card
        window = None  # the first run's requests: its arrivals are the window the search runs on
        for row in runs:
            store = stores[row.get("store", "continuous")]
            requests, passes = store.requests(row["run_id"]), store.passes(row["run_id"])
            window = window or requests
            real = compute_metrics(requests).as_row()
            sim = compute_metrics(simulate_like(row, requests, cost).table).as_row()
            meets = [all(m[s.column] <= s.limit_ms for s in slos) for m in (real, sim)]
            (met if meets[0] else failed)[row["card"]].append(float(row["rate_scale"]))
            offsets[row["card"], name].append(run_offset(cost, passes))
            priced = 1 / offsets[row["card"], name][-1] - 1
            print(f"{name:>{width}} {row['card']:>12} {float(row['rate_scale']):>6g}  "
                  + "  ".join(f"{real[s.column]:>13.1f} {sim[s.column]:>8.1f}" for s in slos)
                  + f"  {meets[0]!s:>10} {meets[1]!s:>9} {priced:>+13.1%}")
        searched.append((name, runs, window, met, failed))
    summary = []
    for name, runs, window, met, failed in searched:
        card_costs = {}  # card: its offset's cost spec, from its runs of the other setups
        for card in set(met) | set(failed) if args.card_offset else ():
            others = [o for (c, n), each in offsets.items() if c == card and n != name for o in each]
            if others:
                card_costs[card] = (f"{args.cost}*{statistics.fmean(others):.5f}", len(others))
        with tempfile.TemporaryDirectory() as tmp:
            path = save_trace(window_at_1x(runs[0], window), Path(tmp) / "window.csv")
            searches = list(dict.fromkeys(costs + [c for c, _ in card_costs.values()]))
            caps = {c["cost"]: c for c in simulated_capacity(path, runs[0], args.slo, searches)}
        answer = float(caps[args.cost]["max_rate_scale"])
        summary.append(f"{name}: simulator meets up to {caps[args.cost]['max_rate_scale']}, fails at "
                       f"{caps[args.cost]['fails_at']}" + "".join(
                           f"; passes x{c.rpartition('*')[2]}: {caps[c]['max_rate_scale']}, {caps[c]['fails_at']}"
                           for c in costs[1:]))
        every = sorted(set(met) | set(failed), key=lambda c: (min(met[c] + failed[c]), c))
        agreed = {"": 0, "offset": 0}
        for card in every:
            fits = agrees(answer, met[card], failed[card])
            agreed[""] += fits
            line = (f"  engine on {card}: " + (f"meets up to {max(met[card]):g}" if met[card] else
                                                "meets at none of its scales")
                    + (f", fails from {min(failed[card]):g}" if failed[card] else ", fails at none")
                    + ("" if fits else " (the simulator's answer disagrees)"))
            if card in card_costs:
                spec, runs_measured = card_costs[card]
                fits = agrees(float(caps[spec]["max_rate_scale"]), met[card], failed[card])
                agreed["offset"] += fits
                line += (f"; simulator with the card's offset ({float(spec.rpartition('*')[2]) - 1:+.2%}, its "
                         f"{runs_measured} run{'s' if runs_measured != 1 else ''} of other setups): meets up to "
                         f"{caps[spec]['max_rate_scale']}, fails at {caps[spec]['fails_at']}"
                         + ("" if fits else " (disagrees)"))
            summary.append(line)
        summary.append(f"  the simulator's answer agrees with {agreed['']} of {len(every)} cards"
                       + (f"; with each card's offset, {agreed['offset']} of {len(card_costs)}" if card_costs else ""))
    print(f"\ncapacity (the highest rate scale meeting {', '.join(map(str, slos))}):")
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
