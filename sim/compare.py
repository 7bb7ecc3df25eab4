"""`python -m sim compare`: the simulator against the real engine, run by run.

For every open run of the continuous engine under results/continuous/ (measured on the GPU the
cost model was calibrated on), the simulator replays exactly the same requests (arrival times,
prompt and output lengths, from the run's own request records) with the same policy, limits,
KV blocks, replicas, router and overlap, with the calibrated cost model. Per run it sets the
metrics side by side (mean, p50, p90, p99 of TTFT, TPOT, ITL and E2EL, throughput, mean batch
size, preemptions; and of TTFT's stages, intake, queue and prefill, where the run's records time
them) with the signed error, and says where a miss comes from, from the records:
the cost model on the run's own passes (predicted against measured durations), the engine's
idle time between passes (which the simulator does not have), preemptions, and what is left
(queueing). Writes OUT/errors.csv, OUT/report.html (one page, opens from disk) and the charts.

Where the same run was measured again (a run of the same setup under results/continuous/ itself,
or in a folder of runs of the same setups measured again, `repeats`, by default
results/continuous-repeats/: the same workload, policy and limits on another GPU or another
day), the real runs' own spread is set beside the simulator's
error, and the simulator is also held to the range the real runs span (no error between them): it
cannot be held closer to one real run than the engine is to itself.

How far each run's result moves with the cost model's own error (`cost_error`, e.g. 0.02): below
saturation the run is simulated again with every pass that much shorter and that much longer
(`sim.cost.ScaledCost`, unscattered), and the simulator is also held to the interval those
results span with its own (no error where the real value lies inside): near saturation a pass
cost 2% off can move TTFT by 10-20%, which no target finer than that can tell from a wrong model.
"""
from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass
from pathlib import Path, PurePath

import numpy as np

from core.metrics import STAGES, compute_metrics
from core.records import PassRecord, RequestRecord
from core.runstore import RunStore
from sim.cost import ScaledCost
from sim.heat import logged_times
from sim.noise import measured_noise
from traces.trace import Trace

METRICS = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "p50", "p90", "p99")
TARGET = {"p50": 0.05, "p90": 0.05, "p99": 0.10}  # below saturation, on TTFT, TPOT and E2EL
DEFAULT_REPEATS = ("continuous-repeats",)  # folders under RESULTS of runs of the same setups measured again
# what makes two engine runs repeats of one measurement
SETUP = ("engine", "model", "gpu", "workload", "rate", "rate_scale", "window", "requests", "policy", "replicas",
         "router", "order", "max_num_seqs", "max_num_batched_tokens", "block_size", "overlap", "preemption")


@dataclass
class Comparison:
    row: dict                 # the engine run's row
    real: list[RequestRecord]
    real_passes: list[PassRecord]
    sim: list[RequestRecord]
    sim_passes: list[PassRecord]
    table: list[dict]         # metric, stat, real, sim, error
    diagnosis: dict

    @property
    def run_id(self) -> str:
        return self.row["run_id"]


def engine_runs(results: Path, gpu: str | None = None) -> list[dict]:
    store = RunStore(results / "continuous")
    if not store.rows_path.exists():
        return []
    return [r for r in store.rows() if r.get("status") == "ok" and r.get("workload") and (gpu is None or r["gpu"] == gpu)]


def trace_of(requests: list[RequestRecord], name: str) -> Trace:
    """The run's own requests as a trace: the arrivals the engine saw, the lengths it served."""
    order = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
    return Trace(np.array([r.arrival_s for r in order]), np.array([r.prompt_tokens for r in order]),
                 np.array([r.max_output_tokens for r in order]), [r.request_id for r in order], name=name)


def simulate_like(row: dict, requests: list[RequestRecord], cost, fast_forward: bool = True, seed: int | None = None):
    """The simulation of an engine run: its requests, its configuration (`cost`: a --cost
    string, or a cost model object such as `sim.replay.MeasuredPasses`); with `seed`, pass and
    host times scatter as the calibration measured the engine's own (`sim.noise`)."""
    from sim.build import RunSpec, simulate_spec
    kv_blocks = row["kv_blocks"]
    if isinstance(kv_blocks, list):  # a row of several replicas may list each one's (they are equal GPUs)
        kv_blocks = min(kv_blocks)
    spec = RunSpec(trace=row["run_id"], policy=row["policy"], model=row["model"],
                   replicas=row.get("replicas") or 1, router=row.get("router") or "round-robin",
                   order=row.get("order", "fcfs"), max_num_seqs=row["max_num_seqs"],
                   max_num_batched_tokens=row["max_num_batched_tokens"], max_model_len=row["max_model_len"],
                   block_size=row["block_size"], kv_blocks=kv_blocks, preemption=row["preemption"],
                   overlap=bool(row.get("overlap")), keep_token_times=True, log_passes=True,
                   fast_forward=fast_forward, run_id=f"sim-{row['run_id']}",
                   noise=seed is not None, seed=seed or 0)
    if isinstance(cost, str):
        return simulate_spec(spec.with_(cost=cost), trace=trace_of(requests, row["run_id"]))
    return simulate_spec(spec, trace=trace_of(requests, row["run_id"]), cost_model=cost)


def stats(metrics) -> dict:
    out = {}
    for name in (*METRICS, *STAGES):
        d = getattr(metrics, name)
        if d is None:  # a stage the records do not time
            continue
        out[name] = {"mean": d.mean, "p50": d.percentiles.get(50.0, d.median), "p90": d.percentiles.get(90.0),
                     "p99": d.percentiles.get(99.0)}
    return out


def signed(sim: float, real: float) -> float:
    return sim / real - 1 if real and not math.isnan(real) and not math.isnan(sim) else math.nan


def saturated(row: dict) -> bool:
    """The engine could not keep up: requests waited longer than a quarter second at the median."""
    return row["median_ttft_ms"] > 250


def in_system(requests: list[RequestRecord], times: np.ndarray) -> np.ndarray:
    """Requests arrived and not finished, at each of `times`."""
    arrive = np.sort([r.arrival_s for r in requests])
    leave = np.sort([r.finish_s if r.finish_s is not None else r.arrival_s for r in requests])
    return np.searchsorted(arrive, times, side="right") - np.searchsorted(leave, times, side="right")


def queue_growth(requests: list[RequestRecord]) -> float:
    """Requests a second the system gains while requests arrive (the slope of requests in the
    system over the arrival period; ~0 below saturation)."""
    arrivals = [r.arrival_s for r in requests]
    t = np.linspace(min(arrivals), max(arrivals), 50)
    n = in_system(requests, t)
    return float(np.polyfit(t, n, 1)[0]) if t[-1] > t[0] else 0.0


def compare(row: dict, store: RunStore, cost: str, cost_model, seeds: int = 0, cost_error: float = 0.0) -> Comparison:
    """The run against its simulation: with `seeds` > 0 (and a cost model that measured the
    engine's scatter) `seeds` simulations with scattered pass and host times, each statistic the
    median over them (`sim_lo_ms`, `sim_hi_ms`: their least and greatest), the passes and the
    diagnosis the first seed's; else the one simulation without scatter. With `cost_error` > 0
    and the run below saturation, two more without scatter, every pass `cost_error` shorter and
    longer (`cost_lo_ms`, `cost_hi_ms`: the least and greatest of the two)."""
    if not 0 <= cost_error < 1:
        raise ValueError(f"cost_error must be from 0 to below 1 (a pass cannot take no time), got {cost_error}")
    real = store.requests(row["run_id"])
    real_passes = store.passes(row["run_id"])
    noisy = seeds > 0 and measured_noise(cost_model) is not None
    results = [simulate_like(row, real, cost, seed=i if noisy else None) for i in range(seeds if noisy else 1)]
    result = results[0]
    real_m = compute_metrics(real)
    sims = [compute_metrics(r.table) for r in results]
    sim_m = sims[0]
    rs, each = stats(real_m), [stats(m) for m in sims]
    shifted = [stats(compute_metrics(simulate_like(row, real, ScaledCost(cost_model, 1 + e)).table))
               for e in (-cost_error, cost_error)] if cost_error > 0 and not saturated(row) else []
    table = []
    timed = [m for m in STAGES if m in rs and all(m in e for e in each)]  # TTFT's stages, where both time them
    for name in (*METRICS, *timed):
        for st in STATS:
            values = [e[name][st] for e in each]
            mid = float(np.median(values))
            table.append({"metric": name, "stat": st, "real_ms": rs[name][st] * 1e3, "sim_ms": mid * 1e3,
                          "error": signed(mid, rs[name][st]), "sim_lo_ms": min(values) * 1e3,
                          "sim_hi_ms": max(values) * 1e3})
            if shifted and name in METRICS:
                moved = [e[name][st] for e in shifted]
                table[-1] |= {"cost_lo_ms": min(moved) * 1e3, "cost_hi_ms": max(moved) * 1e3}
    real_batch = float(np.mean([p.batch_size for p in real_passes]))
    sim_batch = float(np.mean([p.batch_size for p in result.passes])) if result.passes else math.nan
    table += [{"metric": "output_throughput", "stat": "tok/s", "real_ms": real_m.output_throughput,
               "sim_ms": sim_m.output_throughput, "error": signed(sim_m.output_throughput, real_m.output_throughput)},
              {"metric": "mean_batch_size", "stat": "", "real_ms": real_batch, "sim_ms": sim_batch,
               "error": signed(sim_batch, real_batch)},
              {"metric": "preemptions", "stat": "", "real_ms": real_m.preemptions, "sim_ms": sim_m.preemptions,
               "error": signed(sim_m.preemptions, real_m.preemptions) if real_m.preemptions else
               (0.0 if not sim_m.preemptions else math.nan)}]
    measured = np.array([p.duration_s for p in real_passes])
    predicted = np.array(logged_times(cost_model, real_passes))
    gaps = []
    for r in sorted({p.replica for p in real_passes}):
        mine = [p for p in real_passes if p.replica == r]
        gaps += [max(0.0, b.start_s - a.start_s - a.duration_s) for a, b in zip(mine, mine[1:])]
    busy = measured.sum()
    diagnosis = {
        "pass_cost_error": float(predicted.sum() / busy - 1),
        "pass_cost_mape": float(np.mean(np.abs(predicted / measured - 1))),
        "idle_between_passes": float(np.sum([g for g in gaps if g < 0.05]) / busy) if busy else 0.0,
        "preemptions": [real_m.preemptions, sim_m.preemptions],
        "saturated": saturated(row),
        "queue_growth": [queue_growth(real), queue_growth(result.requests)],
        "extrapolated": result.extrapolated,
        "cost_error": cost_error if shifted else 0.0,
        "requests_per_replica": [list(np.bincount([r.replica for r in real], minlength=row.get("replicas") or 1)),
                                 list(np.bincount([r.replica for r in result.requests],
                                                  minlength=row.get("replicas") or 1))],
    }
    diagnosis["verdict"] = verdict(table, diagnosis)
    return Comparison(row, real, real_passes, result.requests, result.passes, table, diagnosis)


def verdict(table: list[dict], d: dict) -> str:
    """Where the miss comes from, in a sentence."""
    ttft = next(t["error"] for t in table if t["metric"] == "ttft" and t["stat"] == "p50")
    tpot = next(t["error"] for t in table if t["metric"] == "tpot" and t["stat"] == "p50")
    parts = [f"the cost model prices the run's own passes {d['pass_cost_error']:+.1%} in total "
             f"({d['pass_cost_mape']:.1%} per pass)"]
    if d["idle_between_passes"] > 0.01:
        parts.append(f"the GPU idled {d['idle_between_passes']:.1%} of its busy time between passes, which the "
                     f"simulator does not model")
    if d["preemptions"][0] != d["preemptions"][1]:
        parts.append(f"preemptions differ (real {d['preemptions'][0]}, simulated {d['preemptions'][1]})")
    if d["saturated"]:
        real_g, sim_g = d["queue_growth"]
        parts.append(f"saturated: the queue grows {real_g:.1f} req/s real, {sim_g:.1f} simulated")
    elif abs(ttft - d["pass_cost_error"]) > 0.05 and abs(ttft) > 0.05:
        parts.append(f"TTFT's {ttft:+.1%} beyond the pass cost is queueing and admission order")
    if abs(tpot - d["pass_cost_error"]) <= 0.03:
        parts.append("TPOT follows the pass cost")
    if d.get("extrapolated"):
        parts.append(f"the simulation priced {d['extrapolated']}")
    stages = {t["metric"]: t for t in table if t["metric"] in STAGES and t["stat"] == "mean"}
    if stages:  # where TTFT's time goes on each side, where the records time it
        parts.append("TTFT's mean by stage, simulated - real: " + ", ".join(
            f"{name} {stages[name]['sim_ms'] - stages[name]['real_ms']:+.2f} ms" for name in STAGES if name in stages))
    moved = next((t for t in table if t["metric"] == "ttft" and t["stat"] == "p50" and "cost_lo_ms" in t), None)
    if moved is not None and moved["real_ms"]:
        lo, hi = (signed(moved[k], moved["real_ms"]) for k in ("cost_lo_ms", "cost_hi_ms"))
        parts.append(f"every pass {d['cost_error']:.0%} shorter or longer puts TTFT p50 at {lo:+.1%} to {hi:+.1%}")
    return "; ".join(parts)


def load_cost(cost: str, model: str):
    from sim.cost import parse_cost
    return parse_cost(cost, model)[0]


def cost_loader(cost: str):
    """`load_cost(cost, model)` as a function of the model's name that loads each one's file once
    (the runs of one model share it)."""
    models = {}

    def of(model: str):
        if model not in models:
            models[model] = load_cost(cost, model)
        return models[model]
    return of


def select_runs(results: Path, gpu: str | None = None, only: str | None = None) -> list[dict]:
    """The open runs to compare (an error naming the directory when there are none)."""
    rows = engine_runs(results, gpu)
    if only:
        rows = [r for r in rows if only in r["run_id"]]
    if not rows:
        raise ValueError(f"no open runs of the continuous engine under {results / 'continuous'}"
                         + (f" matching {only!r}" if only else "") + "; measure some with python -m engine serve-trace")
    return rows


def run_compare(results: Path, cost: str, gpu: str | None = None, only: str | None = None,
                progress=None, seeds: int = 0, cost_error: float = 0.0, jobs: int = 1,
                offsets: dict[str, float] | None = None) -> list[Comparison]:
    """`compare` on every selected run, in `jobs` worker processes (the same comparisons as one
    process makes, in the runs' order; the largest runs start first). With `offsets` ({run id:
    factor}, as from `card_offsets`), only those runs, each with every pass `factor` times as long."""
    rows = select_runs(results, gpu, only)
    specs = [cost] * len(rows)
    if offsets is not None:
        rows = [r for r in rows if r["run_id"] in offsets]
        specs = [f"{cost}*{offsets[r['run_id']]:.6f}" for r in rows]
        if not rows:
            return []
    if jobs <= 1 or len(rows) == 1:
        store = RunStore(results / "continuous")
        out = []
        for i, (row, spec) in enumerate(zip(rows, specs)):
            cost_of = _LOADERS.setdefault(spec, cost_loader(spec))
            out.append(compare(row, store, spec, cost_of(row["model"]), seeds, cost_error))
            if progress is not None:
                progress(i + 1, len(rows))
        return out
    from concurrent.futures import ProcessPoolExecutor, as_completed
    with ProcessPoolExecutor(min(jobs, len(rows))) as pool:
        largest_first = sorted(range(len(rows)), key=lambda i: -(rows[i].get("requests") or 0))
        futures = {i: pool.submit(compare_in_worker, results, rows[i], specs[i], seeds, cost_error)
                   for i in largest_first}
        for done, _ in enumerate(as_completed(futures.values()), 1):
            if progress is not None:
                progress(done, len(rows))
        return [futures[i].result() for i in range(len(rows))]


def card_offsets(results: Path, cost: str, repeats: tuple[str, ...] = DEFAULT_REPEATS) -> dict[str, tuple[float, int]]:
    """{run id: (offset, other runs)} of the runs under RESULTS/continuous whose card served other
    runs of a like load there or in the `repeats` folders: the mean of those runs' measured over
    priced pass time (`sim.card`)."""
    from sim.card import card_offsets as offsets_on_cards
    runs = measured_runs(results, repeats)
    compared = len(engine_runs(results))  # listed first
    return {runs[i][0]["run_id"]: v for i, v in offsets_on_cards(runs, cost_loader(cost), first=compared).items()}


def with_card_offsets(checks: list[dict], carded: list[dict], offsets: dict[str, tuple[float, int]]) -> list[dict]:
    """`targets`' rows with, where the run was simulated again with its card's offset (`carded`:
    `targets` of those comparisons), the offset, how many runs measured it, the worst errors and
    whether the targets are met so."""
    by_run = {t["run_id"]: t for t in carded}
    out = []
    for t in checks:
        c = by_run.get(t["run_id"])
        if c is not None:
            offset, runs = offsets[t["run_id"]]
            t = t | {"card_offset": offset, "card_runs": runs, "card_met": c["met"]} | {
                f"card_{k}": c[k] for k in ("worst_p50_p90", "worst_p99", "queue_growth_error") if k in c}
        out.append(t)
    return out


_LOADERS: dict = {}  # this process's `cost_loader` of each cost spec (a worker's, or the one process's)


def compare_in_worker(results: Path, row: dict, cost: str, seeds: int, cost_error: float) -> Comparison:
    """`compare` in a worker process of `run_compare` (each loads a model's cost model once)."""
    cost_of = _LOADERS.setdefault(cost, cost_loader(cost))
    return compare(row, RunStore(results / "continuous"), cost, cost_of(row["model"]), seeds, cost_error)


def error_rows(comparisons: list[Comparison]) -> list[dict]:
    rows = []
    for c in comparisons:
        w = c.row
        base = {"run_id": c.run_id, "workload": w["workload"], "rate": w.get("rate"), "rate_scale": w.get("rate_scale"),
                "policy": w["policy"], "replicas": w.get("replicas") or 1, "router": w.get("router"),
                "requests": w["requests"], "saturated": c.diagnosis["saturated"],
                "pass_cost_error": c.diagnosis["pass_cost_error"]}
        for t in c.table:
            rows.append(base | t)
    return rows


def repeat_runs(results: Path, repeats: tuple[str, ...] = DEFAULT_REPEATS) -> list[tuple[dict, RunStore]]:
    """The good rows of the runs of the same setups measured again (the `repeats` folders under
    RESULTS, those that exist), each with the store that holds its records."""
    out = []
    for name in repeats:
        store = RunStore(results / name)
        if store.rows_path.exists():
            out += [(r, store) for r in store.rows() if r.get("status") == "ok"]
    return out


def repeat_rows(results: Path, repeats: tuple[str, ...] = DEFAULT_REPEATS) -> list[dict]:
    """The rows of `repeat_runs`, none if there are none."""
    return [r for r, _ in repeat_runs(results, repeats)]


def measured_runs(results: Path, repeats: tuple[str, ...] = DEFAULT_REPEATS) -> list[tuple[dict, RunStore]]:
    """`measured_rows`, each with the store that holds its records (continuous/ or a `repeats` folder)."""
    here = RunStore(results / "continuous")
    return [(r, here) for r in engine_runs(results)] + repeat_runs(results, repeats)


def measured_rows(results: Path, repeats: tuple[str, ...] = DEFAULT_REPEATS) -> list[dict]:
    """Every good open run's row, under results/continuous and the `repeats` folders: among them,
    `repeats_of` finds a run's repeats (runs of one setup under continuous/ repeat each other)."""
    return engine_runs(results) + repeat_rows(results, repeats)


def _setup(row: dict) -> tuple:
    """`row`'s SETUP values; a trace served from a file is named by the file's name, not the folder
    it lay in on the machine that served it."""
    workload = row.get("workload")
    named = PurePath(workload).name if isinstance(workload, str) else workload
    return tuple(named if k == "workload" else row.get(k) for k in SETUP)


def repeats_of(row: dict, repeats: list[dict]) -> list[dict]:
    """The runs of `repeats` that measured `row`'s setup again (two GPUs measuring side by side
    stamp their runs with one run id: a repeat is told from the run itself by its whole row)."""
    setup = _setup(row)
    return [r for r in repeats if r != row and _setup(r) == setup]


def repeat_spread(row: dict, same: list[dict]) -> dict:
    """Per (metric, stat) of TTFT, TPOT, E2EL at p50/p90/p99 the largest |repeat / row - 1| over
    `row`'s repeats `same` (`repeats_of`): how far the engine is from itself."""
    return {(m, st): max((abs(signed(r[f"{st}_{m}_ms"], row[f"{st}_{m}_ms"])) for r in same), default=math.nan)
            for m in ("ttft", "tpot", "e2el") for st in TARGET}


def interval_error(sim_low: float, sim_high: float, real_low: float, real_high: float) -> float:
    """|error| of a simulated interval against a real one: 0 where they meet, else the nearer
    ends' |simulated / real - 1|."""
    if sim_high < real_low:
        return abs(signed(sim_high, real_low))
    if sim_low > real_high:
        return abs(signed(sim_low, real_high))
    return 0.0


def range_errors(c: "Comparison", same: list[dict]) -> dict:
    """Per (metric, stat) of TTFT, TPOT, E2EL at p50/p90/p99: the simulated value's error against
    the range of the real runs of this setup (the run itself and its repeats `same`): 0 inside it,
    else against its nearer end."""
    reals = [c.row] + same
    out = {}
    for t in c.table:
        if t["metric"] in ("ttft", "tpot", "e2el") and t["stat"] in TARGET:
            values = [r[f"{t['stat']}_{t['metric']}_ms"] for r in reals]
            out[t["metric"], t["stat"]] = interval_error(t["sim_ms"], t["sim_ms"], min(values), max(values))
    return out


def cost_errors(c: "Comparison") -> dict:
    """Per (metric, stat) of TTFT, TPOT, E2EL at p50/p90/p99: the error of the simulated interval
    that the run's simulation and its two with every pass `cost_error` shorter and longer span
    (`compare`), against the real value: 0 inside it, else its nearer end / real - 1, as |error|."""
    out = {}
    for t in c.table:
        if t["metric"] in ("ttft", "tpot", "e2el") and t["stat"] in TARGET and "cost_lo_ms" in t:
            out[t["metric"], t["stat"]] = interval_error(min(t["sim_ms"], t["cost_lo_ms"]),
                                                         max(t["sim_ms"], t["cost_hi_ms"]), t["real_ms"], t["real_ms"])
    return out


def targets(comparisons: list[Comparison], repeats: list[dict] = ()) -> list[dict]:
    """Per run below saturation: worst |error| of p50/p90 (target 5%) and p99 (target 10%) over
    TTFT, TPOT and E2EL; above: the queue's growth, real against simulated (target 10%). Where
    the run has repeats: the worst real-against-real difference at p50/p90 and at p99, the worst
    error against the real runs' range at each metric and stat (0 where the simulated value lies
    between real runs), and whether that meets the targets. Where the comparison moved every
    pass by the cost model's error (`compare`'s cost_error): the worst error of the interval the
    moved simulations span (`cost_errors`), and whether that meets the targets."""
    def worst(errors: dict) -> tuple[float, float]:  # (p50/p90, p99) of {(metric, stat): |error|}
        return (max(v for (_, st), v in errors.items() if st != "p99"),
                max(v for (_, st), v in errors.items() if st == "p99"))

    def within(mid: float, tail: float) -> bool:
        return mid <= TARGET["p50"] and tail <= TARGET["p99"]

    out = []
    repeats = list(repeats)
    for c in comparisons:
        same = repeats_of(c.row, repeats)
        if c.diagnosis["saturated"]:
            real_g, sim_g = c.diagnosis["queue_growth"]
            out.append({"run_id": c.run_id, "saturated": True, "queue_growth_error": signed(sim_g, real_g),
                        "met": abs(signed(sim_g, real_g)) <= 0.10, "repeats": len(same)})
            continue
        mid, tail = worst({(t["metric"], t["stat"]): abs(t["error"]) for t in c.table
                           if t["metric"] in ("ttft", "tpot", "e2el") and t["stat"] in TARGET})
        check = {"run_id": c.run_id, "saturated": False, "worst_p50_p90": mid, "worst_p99": tail,
                 "met": within(mid, tail), "repeats": len(same)}
        if same:
            check["repeat_worst_p50_p90"], check["repeat_worst_p99"] = worst(repeat_spread(c.row, same))
            check["range_worst_p50_p90"], check["range_worst_p99"] = worst(range_errors(c, same))
            check["met_against_range"] = within(check["range_worst_p50_p90"], check["range_worst_p99"])
        moved = cost_errors(c)
        if moved:
            check["cost_worst_p50_p90"], check["cost_worst_p99"] = worst(moved)
            check["met_within_cost_error"] = within(check["cost_worst_p50_p90"], check["cost_worst_p99"])
        out.append(check)
    return out


# ---------------------------------------------------------------- charts and the page


def charts(comparisons: list[Comparison], out: Path, scratch: Path) -> dict[str, Path]:
    """CDF overlays per run (into `scratch`: the page inlines them), latency against rate, batch
    size and requests in the system over time (into `out`), as PNG and HTML."""
    import altair as alt
    import pandas as pd

    paths = {}
    frames = []
    for c in comparisons:
        for side, recs in (("real", c.real), ("simulated", c.sim)):
            done = [r for r in recs if r.completed]
            for name, values in (("TTFT", [r.ttft_s for r in done]), ("TPOT", [r.tpot_s for r in done if r.tpot_s]),
                                 ("E2EL", [r.e2el_s for r in done])):
                v = np.sort(np.asarray(values, float)) * 1e3
                if not len(v):
                    continue
                q = np.linspace(0, 1, min(200, len(v)))
                frames.append(pd.DataFrame({"run": c.run_id, "side": side, "metric": name,
                                            "ms": np.quantile(v, q), "fraction": q}))
    cdf = pd.concat(frames)
    for c in comparisons:
        chart = alt.Chart(cdf[cdf.run == c.run_id]).mark_line().encode(
            x=alt.X("ms:Q", scale=alt.Scale(type="log"), title="ms"), y=alt.Y("fraction:Q", title="fraction of requests"),
            color=alt.Color("side:N", title=None), strokeDash="side:N").properties(width=220, height=160).facet(
            column=alt.Column("metric:N", title=None)).resolve_scale(x="independent").properties(title=c.run_id)
        paths[f"cdf-{c.run_id}"] = save_svg(chart, scratch / f"cdf-{c.run_id}")
    seed = {}  # per model, policy and rate, the run of the most requests (the steadiest percentiles)
    for c in comparisons:
        if c.row["workload"] == "seed" and (c.row.get("replicas") or 1) == 1:
            key = (c.row.get("model"), c.row["policy"], c.row["rate"])
            if key not in seed or c.row["requests"] > seed[key].row["requests"]:
                seed[key] = c
    seed = list(seed.values())
    if seed:
        rows = []
        for c in seed:
            for t in c.table:
                if t["metric"] in ("ttft", "tpot") and t["stat"] in ("p50", "p99"):
                    for side in ("real", "sim"):
                        rows.append({"rate": c.row["rate"], "policy": c.row["policy"], "model": c.row.get("model") or "",
                                     "series": f"{t['metric'].upper()} {t['stat']}",
                                     "side": "real" if side == "real" else "simulated", "ms": t[f"{side}_ms"]})
        df = pd.DataFrame(rows)
        # one panel per model and policy: one model's runs are one line against the rate
        chart = alt.Chart(df).mark_line(point=True).encode(
            x=alt.X("rate:Q", scale=alt.Scale(type="log"), title="arrival rate (req/s)"),
            y=alt.Y("ms:Q", scale=alt.Scale(type="log"), title="ms"), color=alt.Color("series:N"),
            strokeDash=alt.StrokeDash("side:N", title=None)).properties(width=300, height=220).facet(
            row=alt.Row("model:N", title=None), column=alt.Column("policy:N")).resolve_scale(x="independent").properties(
            title="The part0 workload's open runs on one H200, by model and policy: real (solid) and simulated (dashed)")
        paths["latency-vs-rate"] = save(chart, out / "latency-vs-rate")
    rows = []
    for c in comparisons:
        if c.row["workload"] != "seed" and (c.row.get("replicas") or 1) == 1 and (c.row.get("rate_scale") or 1) == 1:
            for side, passes, recs in (("real", c.real_passes, c.real), ("simulated", c.sim_passes, c.sim)):
                t = np.array([p.start_s for p in passes])
                if not len(t):
                    continue
                edges = np.linspace(0, max(r.finish_s or r.arrival_s for r in recs), 60)
                idx = np.clip(np.searchsorted(edges, t) - 1, 0, len(edges) - 2)
                batch = np.array([p.batch_size for p in passes])
                mean_batch = [batch[idx == i].mean() if (idx == i).any() else 0.0 for i in range(len(edges) - 1)]
                inside = in_system(recs, edges[:-1])
                for i in range(len(edges) - 1):
                    rows.append({"run": c.run_id, "side": side, "time_s": edges[i], "value": mean_batch[i],
                                 "series": "batch size (mean over the interval)"})
                    rows.append({"run": c.run_id, "side": side, "time_s": edges[i], "value": float(inside[i]),
                                 "series": "requests in the system"})
    if rows:
        df = pd.DataFrame(rows)
        chart = alt.Chart(df).mark_line().encode(
            x=alt.X("time_s:Q", title="time (s)"), y=alt.Y("value:Q", title=None), color=alt.Color("side:N", title=None),
            strokeDash="side:N").properties(width=320, height=140).facet(
            row=alt.Row("run:N", title=None), column=alt.Column("series:N", title=None)).resolve_scale(y="independent")
        paths["over-time"] = save(chart, out / "over-time")
    return paths


def save(chart, stem: Path) -> Path:
    chart.save(str(stem) + ".html")
    chart.save(str(stem) + ".png", ppi=96)
    return Path(str(stem) + ".png")


def save_svg(chart, stem: Path) -> Path:
    """A chart the report page inlines: SVG, a tenth of a PNG's bytes for a few lines."""
    path = Path(str(stem) + ".svg")
    chart.save(str(path))
    return path


def report_page(comparisons: list[Comparison], checks: list[dict], pictures: dict[str, Path], cost: str) -> str:
    """One HTML page with the error table, the diagnosis and the charts inlined (opens offline)."""
    def img(path: Path) -> str:
        kind = "svg+xml" if path.suffix == ".svg" else "png"
        return f'<img src="data:image/{kind};base64,{base64.b64encode(path.read_bytes()).decode()}">'

    def pct(x) -> str:
        return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.1%}"

    e = lambda x: html.escape(str(x))  # noqa: E731  (every text the page embeds: run ids, the cost spec, verdicts)

    head = ("<html><head><meta charset='utf-8'><title>Simulator against engine</title><style>"
            "body{font-family:sans-serif;margin:2em} table{border-collapse:collapse;font-size:13px} "
            "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right} .bad{background:#fdd}</style></head><body>")
    parts = [head, f"<h1>The simulator against the real engine</h1><p>Cost model <code>{e(cost)}</code>. Each engine "
             "run's requests replayed in the simulator with the same policy, limits, KV blocks, replicas, router and "
             "overlap. Error = simulated / real - 1.</p>"]
    parts.append("<h2>Targets</h2><p>Where a run was measured again (repeats): the real runs' own worst "
                 "difference, the simulator's worst error against the real runs' range at each metric and "
                 "percentile (0 between real runs), and whether that meets the targets. Where every pass was "
                 "also simulated shorter and longer by the cost model's error: the worst error of the interval "
                 "those simulations span with the run's own (0 where the real value lies inside), and whether "
                 "that meets the targets. Where the run's card served other runs at a like load: the mean of their "
                 "measured over priced pass time (the card's offset, sim/card.py), and whether the run simulated "
                 "with every pass that much longer meets the targets.</p><table><tr>"
                 "<th>run</th><th>saturated</th><th>worst |error| p50/p90</th><th>worst |error| p99</th>"
                 "<th>queue growth error</th><th>met</th><th>real repeats</th><th>repeats' worst p50/p90</th>"
                 "<th>repeats' worst p99</th><th>against the range: worst p50/p90</th>"
                 "<th>against the range: worst p99</th><th>met against the range</th>"
                 "<th>within the cost error: worst p50/p90</th><th>within the cost error: worst p99</th>"
                 "<th>met within the cost error</th><th>card's offset</th><th>met with the card's offset</th></tr>")
    for t in checks:
        ranged, moved = t.get("met_against_range"), t.get("met_within_cost_error")
        parts.append(f"<tr><td style='text-align:left'>{e(t['run_id'])}</td><td>{e(t['saturated'])}</td>"
                     f"<td>{pct(t.get('worst_p50_p90'))}</td><td>{pct(t.get('worst_p99'))}</td>"
                     f"<td>{pct(t.get('queue_growth_error'))}</td><td class='{'' if t['met'] else 'bad'}'>{e(t['met'])}</td>"
                     f"<td>{e(t.get('repeats', 0))}</td><td>{pct(t.get('repeat_worst_p50_p90'))}</td>"
                     f"<td>{pct(t.get('repeat_worst_p99'))}</td><td>{pct(t.get('range_worst_p50_p90'))}</td>"
                     f"<td>{pct(t.get('range_worst_p99'))}</td><td>{'' if ranged is None else e(ranged)}</td>"
                     f"<td>{pct(t.get('cost_worst_p50_p90'))}</td><td>{pct(t.get('cost_worst_p99'))}</td>"
                     f"<td>{'' if moved is None else e(moved)}</td><td>{pct(t['card_offset'] - 1) if 'card_offset' in t else ''}</td>"
                     f"<td>{e(t.get('card_met', ''))}</td></tr>")
    parts.append("</table>")
    if "latency-vs-rate" in pictures:
        parts.append("<h2>Latency against arrival rate</h2>" + img(pictures["latency-vs-rate"]))
    if "over-time" in pictures:
        parts.append("<h2>Batch size and requests in the system over time</h2>" + img(pictures["over-time"]))
    for c in comparisons:
        moved = c.diagnosis.get("cost_error")
        parts.append(f"<h2>{e(c.run_id)}</h2><p>{e(c.diagnosis['verdict'])}.</p><table><tr><th>metric</th><th>stat</th>"
                     "<th>real</th><th>simulated</th><th>error</th>"
                     + (f"<th>every pass {moved:.0%} shorter / longer</th>" if moved else "") + "</tr>")
        for t in c.table:
            bad = abs(t["error"]) > TARGET.get(t["stat"], 0.05) if not math.isnan(t["error"]) else False
            span = (f"<td>{pct(signed(t['cost_lo_ms'], t['real_ms']))} .. {pct(signed(t['cost_hi_ms'], t['real_ms']))}</td>"
                    if "cost_lo_ms" in t else "<td></td>" if moved else "")
            parts.append(f"<tr><td style='text-align:left'>{e(t['metric'])}</td><td>{e(t['stat'])}</td><td>{t['real_ms']:.3f}</td>"
                         f"<td>{t['sim_ms']:.3f}</td><td class='{'bad' if bad else ''}'>{pct(t['error'])}</td>{span}</tr>")
        parts.append("</table>")
        key = f"cdf-{c.run_id}"
        if key in pictures:
            parts.append(img(pictures[key]))
    parts.append("</body></html>")
    return "\n".join(parts)
