"""`python -m calibrate run|sweep|heat|fit`: time the engine's passes, fit the simulator's cost model.

    python -m calibrate run --model NAME            # on a GPU: the three steps below in turn, ~5-10 minutes
                                                    # (--quick: a reduced grid, a third of the time)
    python -m calibrate sweep                       # on a GPU: a few hundred shapes, ~1 minute
    python -m calibrate heat                        # on a GPU: prompt work's slow-down, by design, ~4 minutes
    python -m calibrate fit                         # the calibration, where the simulator finds it

`sweep` and `heat` write their passes as runs under OUT/calibration/ (default results/ on a GPU,
out/results/ on a CPU); `fit` reads the latest sweep there (or --sweep RUN_ID) and the latest heat
run of the same GPU and model if there is one (the heat model is fitted on it, else on the
sweep's own pass stream), fits on part of the shape grid, reports the error on the rest, fits
again on all of it, replays the open runs' pass logs (results/continuous) through the model, and
writes the calibration to OUT/<model>/NAME.json (--out, default the user's calibrations folder,
$LLMSIM_CALIBRATIONS or ~/.local/share/llm-serving-sim/calibrations, where `--cost calibrated:NAME`
finds it) and MODEL-NAME-errors.csv and the residual charts beside the sweep, the calibration and its
errors as one set.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from core import jsontext
from core.atomic import write_together
from core.cli import SEED_MAX, ArgumentParser, check_writable_dir, number, run_subcommand
from core.config import PRESETS, resolve_model
from core.roofline import get_gpu
from core.runstore import RunStore

REPO = Path(__file__).resolve().parent.parent


def sweep_main(argv: list[str]) -> int:
    p = ArgumentParser(prog="python -m calibrate sweep", description="Time the continuous engine's runner on a "
                                                                     "grid of pass shapes.")
    p.add_argument("--model", default=None, help="preset, config.json or checkpoint directory (default qwen2.5-1.5b on a GPU, tiny on a CPU)")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--device", default="auto")
    p.add_argument("--max-batch", type=number(int, low=1), default=None,
                   help="largest decode batch (default 1024; CPU 8)")
    p.add_argument("--max-context", type=number(int, low=16), default=None,
                   help="longest context (default 16384; CPU 256)")
    p.add_argument("--repeats", type=number(int, low=1), default=3,
                   help="timed passes per shape, after one warm-up (default 3)")
    p.add_argument("--block-size", type=number(int, low=1), default=16)
    p.add_argument("--kernels", choices=("triton", "eager"), default=None)
    p.add_argument("--graphs", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--seed", type=number(int, low=0, high=SEED_MAX), default=0)
    p.add_argument("--max-pass-tokens", type=number(int, low=16), default=32768,
                   help="largest pass of the grid, in tokens (default 32768, the engine's max_num_batched_tokens; "
                        "262144 adds closed batches' single prompt passes)")
    p.add_argument("--launch", choices=("windows", "served"), default="windows",
                   help="timed passes launched 16 at a time behind a short lead, each window built first "
                        "(windows, default), or each built and launched while the one before it runs, as the "
                        "serving loop does (served)")
    p.add_argument("--in-a-row", type=number(int, low=1), default=1, metavar="K",
                   help="time each shape of a round K times back to back (with --launch served its batch built "
                        "once), as a GPU kept busy on one shape runs it; a diagnostic: its rows' kind ends in "
                        "-in-a-row, which fit does not read (default 1)")
    p.add_argument("--grid", choices=("default", "mixtures", "mixed"), default="default",
                   help="the calibration's grid (default); decode batches of spread contexts beside their twins "
                        "of one context (mixtures); or mixed passes as the chunked policy builds them on a served "
                        "trace, beside the default grid's own (mixed). mixtures and mixed are diagnostics: their "
                        "rows' kinds, sweep-mixtures and sweep-mixed, are not what fit reads")
    p.add_argument("--quick", action="store_true",
                   help="the default grid reduced to about a third of its shapes (calibrate.sweep.quick_shapes: "
                        "the decode batches of every power of two, multiple of 64 and held-out size; every other "
                        "shape): a coarser table of decode graph times, the same held-out error report")
    p.add_argument("--out", default=None, help="results directory (default results/ on a GPU, out/results/ on a CPU)")
    try:
        args = p.parse_args(argv)
        import torch
        from tqdm import tqdm

        from calibrate.sweep import (GRID_TOKENS_HELD, MIXTURE_BATCHES, blocks_needed, default_shapes, mixed_shapes,
                                     mixture_shapes, quick_shapes, run_sweep)
        from engine.continuous import ModelRunner
        from engine.kernels import choose_kernels
        from engine.paged import PagedKVCache
        from engine.provenance import provenance, resolve_device
        from engine.weights import load_model, parse_dtype

        device = resolve_device(args.device)
        gpu = device.type == "cuda"
        dtype = parse_dtype(args.dtype)
        kernels = choose_kernels(args.kernels or ("triton" if gpu else "eager"))
        graphs = args.graphs == "on" or (args.graphs == "auto" and gpu and kernels == "triton")
        max_batch = args.max_batch or (1024 if gpu else 8)
        max_context = args.max_context or (16384 if gpu else 256)
        if args.repeats < 1 or max_batch < 1 or max_context < 16:
            raise ValueError("--repeats and --max-batch must be >= 1, --max-context >= 16")
        source = args.model or ("qwen2.5-1.5b" if gpu else "tiny")
        out = Path(args.out) if args.out else REPO / ("results" if gpu else "out/results")
        check_writable_dir(out)
        model, weights = load_model(source, dtype, device, seed=args.seed)
        # the grid's batches hold up to GRID_TOKENS_HELD cached positions (57 GB for the 1.5B), fewer where
        # the model's KV cache would not fit beside its weights (an 8B's 2,000,000 take 262 GB)
        held = held_on_device(model.config, device, dtype) if gpu else None
        if args.grid == "mixtures":
            shapes = mixture_shapes(max_batch, max_context, seed=args.seed)
            if not shapes:
                raise ValueError(f"--grid mixtures times batches of {min(MIXTURE_BATCHES)} sequences and more; "
                                 f"--max-batch is {max_batch}")
        elif args.grid == "mixed":
            shapes = mixed_shapes(max_batch, max_context, seed=args.seed)
        else:
            shapes = default_shapes(max_batch, max_context, max_tokens_held=GRID_TOKENS_HELD if gpu else 20_000,
                                    seed=args.seed, max_pass_tokens=args.max_pass_tokens)
        shapes = [s for s in shapes if held is None or s.tokens_held <= held]
        if not shapes:
            raise ValueError(f"--model {model.config.name}: no shape of the grid fits the {held:,} cached positions "
                             "that the GPU's free memory holds beside the weights")
        if args.quick:
            if args.grid != "default":
                raise ValueError(f"--quick reduces the default grid, not --grid {args.grid}")
            shapes = quick_shapes(shapes, max_batch)
        blocks = max(blocks_needed(s, args.block_size) for s in shapes)
        cache = PagedKVCache(model.config, blocks, args.block_size, dtype, device)
        runner = ModelRunner(model, cache, max_batch, kernels, graphs)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    store = RunStore(out / "calibration")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    in_a_row = args.in_a_row > 1
    # (fit reads the kind "sweep" alone)
    kind = ("sweep" if args.grid == "default" else f"sweep-{args.grid}") + ("-in-a-row" if in_a_row else "")
    run_id = f"{kind}-{stamp}"
    timed = f"{args.repeats}" + (f" x {args.in_a_row} in a row" if in_a_row else "")
    print(f"{len(shapes)} shapes x ({timed} timed + 1 warm-up) on {provenance(device)['gpu']}, kernels "
          f"{kernels}{' + CUDA graphs' if graphs else ''}, {blocks:,} KV blocks")
    wall = time.perf_counter()
    total = len(shapes) * (args.repeats * args.in_a_row + 1)
    with tqdm(total=total, desc="sweep", unit="pass", file=sys.stderr) as bar:
        passes = run_sweep(runner, shapes, args.repeats, args.seed, run_id,
                           progress=lambda i, n: bar.update(i - bar.n), launch=args.launch, in_a_row=args.in_a_row)
    meta = {"model": model.config.name, "weights": weights, "dtype": str(dtype).removeprefix("torch."),
            "device": device.type, **provenance(device)}
    row = {"run_id": run_id, "engine": "continuous", "kind": kind, "shapes": len(shapes), "repeats": args.repeats,
           "passes": len(passes), "launch": args.launch, "in_a_row": args.in_a_row,
           "max_pass_tokens": args.max_pass_tokens, "max_batch": max_batch, "max_context": max_context,
           "quick": args.quick,
           "block_size": args.block_size,
           "kernels": kernels, "graphs": graphs, "graph_buckets": runner.buckets if graphs else [],
           "token_buckets": runner.fast.token_buckets if graphs else [],
           "decode_attention": runner.fast.attention.slicing() if runner.fast else None,
           "chunk_attention": engine_chunk_tiles(model.config),
           # (on a CPU its cores stand in for the SMs, so that a smoke run's fit has a waves' shape)
           "sms": torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda"
           else os.cpu_count() or 1,
           "kv_blocks": blocks, "wall_s": time.perf_counter() - wall, **meta}
    store.write_run(run_id, passes, [], row)
    print(f"{len(passes)} passes in {row['wall_s']:.0f} s -> {store.run_dir(run_id)}")
    return 0


def heat_main(argv: list[str]) -> int:
    p = ArgumentParser(prog="python -m calibrate heat",
                       description="Time designed sequences of prompt and decode passes after rests (calibrate/response.py): "
                                   "how fast prompt work slows the GPU and how fast it recovers, for the heat model.")
    p.add_argument("--model", default=None, help="preset, config.json or checkpoint directory (default qwen2.5-1.5b on a GPU, tiny on a CPU)")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--device", default="auto")
    p.add_argument("--repeats", type=number(int, low=1), default=3, help="rounds over the sequences (default 3)")
    p.add_argument("--rest", type=number(float, low=0.0), default=1.5,
                   help="seconds idle before each sequence (default 1.5)")
    p.add_argument("--scale", type=number(float, low=0.01, high=1.0), default=1.0,
                   help="each sequence's pass counts times SCALE, at least one (default 1; `calibrate run` sets it "
                        "so that a larger model's sequences last about as long as the 1.5B's: the heat is a "
                        "matter of seconds of work, not of passes)")
    p.add_argument("--out", default=None, help="results directory (default results/ on a GPU, out/results/ on a CPU)")
    try:
        args = p.parse_args(argv)
        import os

        from calibrate.response import CPU_SHAPES, measure, segments, telemetry
        from calibrate.sweep import blocks_needed, run_sweep
        from engine.continuous import ModelRunner
        from engine.kernels import choose_kernels
        from engine.paged import PagedKVCache
        from engine.provenance import provenance, resolve_device
        from engine.weights import load_model, parse_dtype

        device = resolve_device(args.device)
        gpu = device.type == "cuda"
        out = Path(args.out) if args.out else REPO / ("results" if gpu else "out/results")
        check_writable_dir(out)
        model, weights = load_model(args.model or ("qwen2.5-1.5b" if gpu else "tiny"), parse_dtype(args.dtype), device)
        if gpu:  # (an 8B model's cache holds fewer positions than the largest decode batch's 1,048,576)
            held = held_on_device(model.config, device, parse_dtype(args.dtype))
            plan = heat_plan(args.scale, held)
            left = [name for name, _ in segments(args.scale) if name not in dict(plan)]
            if left:
                print(f"left out (more cached positions than the {held:,} that fit beside the weights): "
                      + ", ".join(left), flush=True)
        else:  # a CPU run is a smoke run: short, small
            plan = segments(0.02 * args.scale, **CPU_SHAPES)
        shapes = sorted({s for _, seg in plan for s in seg}, key=lambda s: s.group)
        cache = PagedKVCache(model.config, max(blocks_needed(s, 16) for s in shapes), 16, parse_dtype(args.dtype), device)
        kernels = choose_kernels("triton" if gpu else "eager")
        runner = ModelRunner(model, cache, max(len(s.seqs) for s in shapes), kernels, graphs=kernels == "triton" and gpu)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    store = RunStore(out / "calibration")
    run_id = "heat-" + dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    run_sweep(runner, shapes, repeats=1, run_id="warm-up", launch="served")  # compiles, captures graphs; untimed
    tmp = store.root / f".{run_id}.telemetry.csv"
    store.root.mkdir(parents=True, exist_ok=True)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0] or str(device.index or 0)
    smi = telemetry(tmp, visible) if gpu else None
    wall = time.perf_counter()
    try:
        passes, marks = measure(runner, plan, args.repeats, args.rest, run_id,
                                progress=lambda name, rep, ps: print(f"{name} r{rep}: {len(ps)} passes, "
                                                                     f"{sum(q.duration_s for q in ps):.3f} s busy", flush=True))
    finally:
        if smi is not None:
            smi.terminate()
            smi.wait()
    row = {"run_id": run_id, "engine": "continuous", "kind": "heat", "model": model.config.name, "weights": weights,
           "dtype": str(parse_dtype(args.dtype)).removeprefix("torch."), "device": device.type, "passes": len(passes),
           "repeats": args.repeats, "rest_s": args.rest, "scale": args.scale, "segments": marks, "wall_s": time.perf_counter() - wall,
           **provenance(device)}

    def telemetry_beside(run_dir: Path) -> None:  # beside the passes, compressed, in the run's directory
        if tmp.exists():
            import gzip
            import shutil
            with tmp.open("rb") as src, gzip.open(run_dir / "telemetry.csv.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)

    store.write_run(run_id, passes, [], row, extra=telemetry_beside)
    tmp.unlink(missing_ok=True)
    print(f"{len(passes)} passes in {row['wall_s']:.0f} s -> {store.run_dir(run_id)}")
    return 0


def fit_main(argv: list[str]) -> int:
    from calibrate.fit import (NO_SPREAD, constants, error_table, fit_mixed, fit_params, fit_schedule, format_errors,
                               format_params, group_of, held_out, mape, roofline_prior_error, skeleton, sweep_range,
                               waves_of)
    import numpy as np

    from calibrate.heat import fit_response, fit_serving, fit_with_heat, repeat_scatter, rested_scatter
    from calibrate.mixtures import fit_spread, mixture_pairs, pair_miss
    from calibrate.replay import engine_runs, replay_runs, runs_read
    from sim.heat import factors
    from sim.calibrated import CalibratedCost
    from sim.cost import gpu_preset, user_calibrations

    p = ArgumentParser(prog="python -m calibrate fit", description="Fit the cost model to a sweep's passes.")
    p.add_argument("--results", default=str(REPO / "results"), help="where the sweep and the open runs are")
    p.add_argument("--sweep", default="latest",
                   help="the sweep's run id (default: the latest under RESULTS, of --model where it is given)")
    p.add_argument("--name", type=calibration_name, default=None,
                   help="the calibration's name (default: the GPU's, e.g. h200): --cost calibrated:NAME")
    p.add_argument("--out", type=Path, default=None,
                   help="folder of calibrations: the file is OUT/<model>/NAME.json (default $LLMSIM_CALIBRATIONS, "
                        "else ~/.local/share/llm-serving-sim/calibrations; the project's own: sim/calibrations)")
    p.add_argument("--model", default=None, help="refuse a sweep of another model than this one")
    p.add_argument("--gpu", default=None, help="refuse a sweep on another GPU than this preset (e.g. h200)")
    p.add_argument("--no-charts", action="store_true", help="skip the residual charts")
    p.add_argument("--spread", action="store_true",
                   help="fit decode attention's spread term (sim.calibrated) on the pairs of the `calibrate sweep "
                        "--grid mixtures` runs of this GPU and model under RESULTS/calibration (an error if "
                        "there are none); without it the term is 0")
    p.add_argument("--mixed", action="store_true",
                   help="price mixed passes run as CUDA graphs by their chunk attention's tiles list-scheduled "
                        "(sim.calibrated's `mixed` form, fitted on the sweep's prompt and mixed passes) instead of "
                        "the waves of a mean tile")
    p.add_argument("--serving-heat", action="store_true",
                   help="refit the heat's slow-downs (decode, prompt, and mixed passes on their own) on the open "
                        "runs' pass logs under RESULTS/continuous of this GPU and model, at the heat run's time "
                        "constants and loads (calibrate.heat.fit_serving); without it the heat run's own")
    p.add_argument("--runs-of", type=Path, default=None, metavar="CALIBRATION",
                   help="read only the open and closed runs this calibration file read (its `runs_read`: for its "
                        "host time, serving heat and replays), so that runs measured since stay held out and the "
                        "fit reproduces it (e.g. sim/calibrations/qwen2.5-1.5b/h200.json); default: every run under RESULTS")
    p.add_argument("--no-heat-run", action="store_true",
                   help="fit the heat on the sweep's own pass stream even where a heat run of this GPU and model "
                        "is there (a CPU's: its short sequences leave some shapes no rested pass)")
    p.add_argument("--schedule", action="store_true",
                   help="price decode attention of batches that fill the GPU by its programs' schedule "
                        "(sim.schedule: its rates and those batches' graph times fitted on the sweep's passes) "
                        "instead of the form's waves")
    try:
        args = p.parse_args(argv)
        results = Path(args.results)
        only = runs_of(args.runs_of) if args.runs_of else None
        store = RunStore(results / "calibration")
        sweeps = [r for r in store.rows() if r.get("kind") == "sweep"]
        if not sweeps:
            raise ValueError(f"no sweep under {store.root}: run `python -m calibrate sweep` on a GPU first")
        check_writable_dir(store.root, "--results")  # the calibration is written beside its sweep
        if args.sweep == "latest":  # (of --model, where it is given: one folder holds several models' sweeps)
            mine = [r for r in sweeps if not args.model or r.get("model") == args.model]
            if not mine:
                raise ValueError(f"no sweep of --model {args.model} under {store.root}")
            row = mine[-1]
        else:
            row = next((r for r in sweeps if r["run_id"] == args.sweep), None)
        if row is None:
            raise ValueError(f"--sweep {args.sweep!r}: no such sweep under {store.root}")
        missing = [k for k in SWEEP_FIELDS if k not in row]
        if missing:
            raise ValueError(f"{store.rows_path}: the row of sweep {row.get('run_id')!r} lacks {', '.join(missing)}")
        if row.get("engine") != "continuous":
            raise ValueError(f"sweep {row['run_id']} timed the {row.get('engine')!r} engine; the cost model is the "
                             "continuous engine's")
        if args.model and row["model"] != args.model:
            raise ValueError(f"sweep {row['run_id']} timed {row['model']!r}, not --model {args.model!r}")
        if args.gpu and get_gpu(args.gpu).name not in (row["gpu"], getattr(gpu_preset(row["gpu"])[1], "name", None)):
            raise ValueError(f"sweep {row['run_id']} ran on {row['gpu']!r}, not --gpu {args.gpu} "
                             f"({get_gpu(args.gpu).name})")
        cal_dir = args.out or user_calibrations()
        if cal_dir.exists() and not cal_dir.is_dir():
            raise ValueError(f"--out {cal_dir}: not a folder")
        passes = store.passes(row["run_id"])
        check_sweep(row, passes, store.run_dir(row["run_id"]))
        try:  # the open and closed runs read below (for the host time, --serving-heat and the replays)
            read = runs_read(results, row["gpu"], row["model"], only)
        except ValueError as e:
            raise ValueError(f"--runs-of {args.runs_of}: {e}") from None
        if args.serving_heat and not read["continuous"]:  # said now, not after minutes of fitting
            raise ValueError(f"--serving-heat: no open runs' passes to fit the heat's slow-downs on (none of "
                             f"{row['model']} on {row['gpu']} under {results / 'continuous'})")
        model = resolve_model(row["model"])
        c = constants(model, 2 if row["dtype"] in ("float16", "bfloat16") else 4)
        meta = {"model": row["model"], "gpu": row["gpu"], "dtype": row["dtype"], "engine": "continuous",
                "engine_commit": row["git_commit"], "torch": row["torch"], "sweep": row["run_id"],
                "block_size": row["block_size"]}
        base = skeleton(meta, c, row["graph_buckets"] or [], row.get("token_buckets") or [],
                        row.get("decode_attention") or engine_slicing(),
                        row.get("chunk_attention") or engine_chunk_tiles(model), waves_of(row))
        base["range"] = sweep_range(passes)
        shape = CalibratedCost(base | {"parameters": placeholder(base)})
        # (a sweep without CUDA graphs, a CPU's, records no buckets: the sizes between those its graphs
        # would have had are held out all the same, else every decode batch would be)
        from engine.buckets import graph_buckets
        split_buckets = shape.buckets or graph_buckets(row.get("max_batch") or sweep_range(passes)["decode_batch"] or 1)
        split = ["held-out" if held_out(group_of(q), split_buckets) else "fitted" for q in passes]
        train = [q for q, s in zip(passes, split) if s == "fitted"]

        spread = NO_SPREAD  # decode attention's spread term: fitted on the mixtures' pairs, if any, below

        def fit(qs):
            params = fit_params(qs, c, shape, spread, prompts_only=args.mixed)
            params = fit_schedule(qs, params, shape) if args.schedule else params
            return fit_mixed(qs, params, shape) if args.mixed else params

        def predict_all(params, qs):
            return CalibratedCost(base | {"parameters": params}).predict_all(qs)

        # passes slowed by recent prompt work (sim.heat): fitted on the latest heat run of this GPU
        # and model if there is one, else with the model on the sweep's own order of passes;
        # predictions below carry each pass's factor
        measured_heat, heat_run = None, None
        heat_rows = [r for r in store.rows() if r.get("kind") == "heat" and r.get("gpu") == row["gpu"]
                     and r.get("model") == row["model"]]
        if heat_rows and not args.no_heat_run:
            heat_run = heat_rows[-1]
            heat_passes = store.passes(heat_run["run_id"])
            measured_heat, heat_errors = fit_response(heat_passes, heat_run["segments"])
        mix, mix_runs = mixture_pairs(results, row["gpu"], row["model"]) if args.spread else ([], [])
        if args.spread and not mix:
            raise ValueError(f"--spread: no `calibrate sweep --grid mixtures` run of {row['model']} on {row['gpu']} "
                             f"under {results / 'calibration'}")
        if mix:  # the spread term: on what the form fitted without it leaves of the pairs' differences
            params, _ = fit_with_heat(passes, fit, predict_all, heat=measured_heat)
            spread_from, spread_rates, _ = fit_spread(mix, CalibratedCost(base | {"parameters": params}))
            spread = (spread_from, spread_rates)
        params_train, heat_train = fit_with_heat(train, fit, predict_all, heat=measured_heat)
        predicted_train = np.asarray(predict_all(params_train, passes)) * factors(passes, heat_train)
        errors = error_table(passes, predicted_train, split)
        params, heat = fit_with_heat(passes, fit, predict_all, heat=measured_heat)
        in_sample = mape(np.asarray(predict_all(params, passes)) * factors(passes, heat),
                         [q.duration_s for q in passes])
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    preset, gpu_spec = gpu_preset(row["gpu"])
    prior = roofline_prior_error(passes, model, gpu_spec) if gpu_spec else []
    name = args.name or preset or "gpu"
    doc = base | {"fitted_on": len(passes), "in_sample_mape": in_sample, "parameters": params,
                  "heat": heat.as_dict(), "heat_fitted_on": heat_run["run_id"] if heat_run else row["run_id"],
                  "spread_fitted_on": mix_runs, "held_out_fit": params_train, "held_out_heat": heat_train.as_dict(),
                  "error": [e.__dict__ for e in errors], "roofline_prior_error": prior}
    cost = CalibratedCost(doc)
    serving = None
    if args.serving_heat:  # the slow-downs the simulator prices with, refitted on the engine's open runs
        try:
            runs = [runs_store.passes(r["run_id"]) for runs_store, r in engine_runs(results, row["gpu"], row["model"],
                                                                                      only)
                    if runs_store.root.name == "continuous"]
            served, serving = fit_serving(runs, cost, heat)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        doc["heat_run_fit"], doc["heat"] = doc["heat"], served.as_dict()
        doc["heat_slopes_fitted_on"] = serving
        cost = CalibratedCost(doc)
    try:  # the engine's host time, measured from the open runs' pass logs against this cost model
        from calibrate.host import measure as measure_host
        doc["host"], host_sigmas, host_basis = measure_host(results, cost, row["gpu"], row["model"], only)
    except ValueError as e:  # no open runs of this GPU and model to measure it on: no host time
        host_basis, host_sigmas = None, {}
        print(f"host time: not measured ({e})")
    # the engine's scatter (sim.noise, --noise): a rested pass's, from the heat run (else the sweep's
    # repeats of a shape), and the host's terms', from the open runs' pass logs
    pass_sigma = rested_scatter(heat_passes, heat_run["segments"]) if heat_run else repeat_scatter(passes)
    doc["noise"] = {"pass_sigma": pass_sigma} | host_sigmas
    doc["runs_read"] = read
    out = cal_dir / row["model"] / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    check_writable_dir(out.parent, "--out")
    note = changed_runs(out, read)
    if note:
        print(f"note: {out.name} is rewritten on other runs than it was fitted on ({note}); "
              f"`--runs-of {out}` reads the same ones")
    doc["replays"] = replay_runs(results, CalibratedCost(doc), row["gpu"], row["model"], only)
    import pandas as pd
    errors_csv = pd.DataFrame([e.__dict__ for e in errors]).to_csv(index=False)
    stem = f"{row['model']}-{name}"  # (one folder of sweeps holds several models' fits: MODEL-NAME-errors.csv)
    write_together({store.root / f"{stem}-errors.csv": errors_csv, out: jsontext.dumps(doc, indent=1) + "\n"}, last=out)
    print(f"wrote {out} (--cost calibrated:{name} with --model {row['model']}) and {store.root / f'{stem}-errors.csv'}")
    print(f"sweep {row['run_id']} on {row['gpu']}: {len(passes)} passes, {len(train)} fitted for the held-out "
          f"error, then all {len(passes)} for the parameters")
    print("parameters (all passes):\n" + format_params(params))
    print("error of the fit on the other shapes (held-out) and on its own (fitted):\n" + format_errors(errors))
    print(f"in-sample MAPE of the final fit: {in_sample:.2%}")
    print(f"decode attention's spread term: fitted on {len(mix)} pairs of a spread batch and its twin "
          f"({', '.join(mix_runs)}); small batches' differences' RMS miss {pair_miss(mix, cost):.2%} of a batch's time"
          if mix else "decode attention's spread term: 0 (--spread fits it)")
    print(f"after prompt work: decode up to {heat.decode:.1%} slower, prefill {heat.prefill:.1%}, rising over "
          f"{heat.rise_s * 1e3:.0f} ms of it, recovering over {heat.tau_s * 1e3:.0f} ms, full load at "
          f"{heat.full_tokens or 'any'} prompt tokens (sim.heat; fitted on "
          + (f"heat run {heat_run['run_id']}: mean error decode {heat_errors['decode']:.2%}, prefill "
             f"{heat_errors['prefill']:.2%}" + "".join(f"; {k} passes measured / priced {v:+.2%}" for k, v in
                                                       heat_errors.items() if k.startswith("checked")) + ")"
             if heat_run else "the sweep's own pass stream)"))
    if serving:
        print(f"slow-downs refitted on the open runs (--serving-heat; {serving['runs']} runs, {serving['passes']} "
              f"passes): decode {served.decode:.1%}, prefill {served.prefill:.1%}, mixed passes {served.mixed:.1%}; "
              "their passes priced / logged - 1, with the heat run's slow-downs and with these: " +
              ", ".join(f"{k} {serving['before'][k]:+.2%} -> {serving['after'][k]:+.2%}" for k in serving["after"]))
    if host_basis:
        print("host time: " + ", ".join(f"{k} {v}" if k == "graph_tokens" else f"{k} {v * 1e6:.1f} us"
                                        for k, v in doc["host"].items()) +
              " (measured on " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in host_basis.items()) + ")")
    print("scatter (sim.noise, --noise; robust sigma of the log): " +
          ", ".join(f"{k} {v:.4f}" for k, v in doc["noise"].items()))
    if prior:
        print("the roofline alone (no fitted term, no overhead), per regime: " +
              ", ".join(f"{p['regime']} {p['signed_median']:+.0%} (MAPE {p['mape']:.0%})" for p in prior))
    for r in doc["replays"]:
        print(f"replay {r['run_id']}: pass-time MAPE {r['pass_mape']:.2%}, total busy time {r['busy_error']:+.2%}"
              + (f", ITL {r['itl_error']:+.2%}, TTFT {r['ttft_error']:+.2%}" if r.get("itl_error") is not None else "")
              + ("".join(f"; {n:,} pass{'' if n == 1 else 'es'} beyond the sweep's {k}" for k, n in r["extrapolated"].items())
                 if r.get("extrapolated") else ""))
    if not args.no_charts:
        from calibrate.charts import residual_charts
        for path in residual_charts(passes, predicted_train, split, store.root, stem):
            print(f"chart: {path}")
    print(f"written {out}")
    return 0


def runs_of(path: Path) -> dict:
    """`--runs-of`: the runs a calibration file read ({folder: run ids}, its `runs_read`)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--runs-of {path}: not a readable calibration file ({e})") from None
    read = doc.get("runs_read") if isinstance(doc, dict) else None
    if not isinstance(read, dict) or not all(isinstance(v, list) for v in read.values()):
        raise ValueError(f"--runs-of {path}: the file records no `runs_read` (calibrations written before it kept "
                         "only their runs' count)")
    return read


def changed_runs(path: Path, read: dict) -> str | None:
    """How the runs a fit reads (`read`) differ from those the calibration at `path` read (its
    `runs_read`), in words; None where they are the same, or the file is not there or keeps no list."""
    try:
        before = runs_of(path)
    except ValueError:
        return None
    parts = []
    for folder in sorted(set(before) | set(read)):
        old, new = set(before.get(folder, ())), set(read.get(folder, ()))
        if new - old:
            parts.append(f"{len(new - old)} more under {folder}/")
        if old - new:
            parts.append(f"{len(old - new)} fewer under {folder}/")
    return ", ".join(parts) or None


def calibration_name(text: str) -> str:
    """`--name`: NAME.json is written beside the sweep, so a plain file name (no path separators)."""
    if not text or "/" in text or "\\" in text or text in (".", ".."):
        raise argparse.ArgumentTypeError(f"a calibration's name is a plain file name, got {text!r}")
    return text


def engine_slicing() -> dict:
    """How the engine's decode attention slices contexts (for a sweep that did not record it)."""
    from engine.kernels.tiles import DECODE_PROGRAMS, DECODE_SLICES, FILLS_GPU
    return {"kv_heads": 2, "fills_gpu": FILLS_GPU, "block_n": 64, "small": list(DECODE_SLICES[False]),
            "big": list(DECODE_SLICES[True]), "programs": DECODE_PROGRAMS}


SWEEP_FIELDS = ("run_id", "engine", "model", "gpu", "dtype", "git_commit", "torch", "block_size", "graph_buckets")


def check_sweep(row: dict, passes: list, where: Path) -> None:
    """The sweep's passes are fit to fit: every duration finite and positive, and the passes those
    of the model its row names (within its context, and with its attention's tiles)."""
    model = resolve_model(row["model"])
    if not passes:
        raise ValueError(f"{where}: the sweep {row['run_id']} holds no passes")
    for i, q in enumerate(passes):
        if not (isinstance(q.duration_s, (int, float)) and math.isfinite(q.duration_s) and q.duration_s > 0):
            raise ValueError(f"{where}: pass {i} (step {q.step}) has duration_s {q.duration_s!r}; a pass "
                             "takes a finite, positive time")
        longest = max((c + n for c, n in zip(q.context_lens, q.new_tokens)), default=0)
        if longest > model.context_length:
            raise ValueError(f"{where}: pass {i} (step {q.step}) reaches position {longest:,}, past "
                             f"{row['model']}'s context of {model.context_length:,}: not a sweep of {row['model']}")
    recorded = (row.get("chunk_attention") or {}).get("tile_tokens")
    if recorded is not None and recorded != engine_chunk_tiles(model)["tile_tokens"]:
        raise ValueError(f"{where}: the sweep's chunk attention tiles ({recorded} query tokens) are not "
                         f"{row['model']}'s ({engine_chunk_tiles(model)['tile_tokens']}): not a sweep of {row['model']}")


def engine_chunk_tiles(model) -> dict:
    """The query tokens of one chunk-attention tile (for a sweep that did not record it): the
    engine's tile rows over the query heads sharing a KV head."""
    from engine.kernels.tiles import chunk_tile
    group = model.num_attention_heads // model.num_key_value_heads
    return {"tile_tokens": chunk_tile(group) // group}


def placeholder(base: dict) -> dict:
    """Parameters of the right shape (their values unused) to build the model's fixed parts."""
    rates = {"kv_gbs": 1.0}
    return {"decode1": {}, "prefill": {}, "decode": {"small": rates, "big": rates,
                                                     "graph_s": {str(b): 0.0 for b in base["graph_buckets"] or [1]}}}


STEPS = ("sweep", "heat", "fit")
SWEEP_PASS_HOST_S = 0.015  # a timed pass's host time in a sweep's windows: 103 s for 4,000 passes priced 42 s (H200)
STEP_START_S = 30.0  # a step's start: torch, the model's random weights, the CUDA graphs' capture (a guess)
FIT_S_PER_PASS = 0.05  # the fit's least squares, per pass swept (a 2-core host: 2,004 passes in 144 CPU-seconds)
# a CPU's grid: the least whose shapes the fit's terms need once the held-out ones are set aside
# (batches of 64, prompts of 2,048, contexts past 4,096: 6,000 for batch 1's sixth), within the tiny
# model's 8,192 positions (a chunk of 4,096 on 4,096 cached fills them)
CPU_GRID = ["--max-batch", "64", "--max-context", "6144"]


def run_main(argv: list[str]) -> int:
    p = ArgumentParser(prog="python -m calibrate run",
                       description="Calibrate the simulator for a model on this machine's GPU in one command: "
                                   "`sweep`, `heat` and `fit` in turn (each its own process, so that the GPU's "
                                   "memory is freed between them), writing the calibration the simulator finds "
                                   "from --model and the GPU (CALIBRATIONS/<model>/<gpu>.json: `python -m sim run "
                                   "--model NAME` uses it), then the fit's error on the held-out shapes. An estimate "
                                   "of the time it takes is printed first. On a CPU (the tiny model) it is a smoke "
                                   "run on a small grid: the sweep and the fit, no heat run (a GPU's slow-down), "
                                   "a calibration the simulator, which prices GPUs, does not use.")
    p.add_argument("--model", default=None, help="model preset (default qwen2.5-1.5b on a GPU, tiny on a CPU)")
    p.add_argument("--quick", action="store_true",
                   help="a reduced grid: the sweep's --quick shapes (a third) timed twice, the heat's sequences "
                        "once, not twice (about half the full run's time; a coarser table of decode graph times)")
    p.add_argument("--device", default="auto", help="auto (a GPU when torch sees one), cpu, cuda or cuda:N")
    p.add_argument("--dtype", default=None, help="the engine's dtype (default float16 on a GPU, float32 on a CPU)")
    p.add_argument("--results", type=Path, default=None,
                   help="where the sweep and heat runs are written and the fit reads them and the open runs "
                        "(default results/ on a GPU, out/results/ on a CPU)")
    p.add_argument("--out", type=Path, default=None,
                   help="folder of calibrations: the file is OUT/<model>/NAME.json (default $LLMSIM_CALIBRATIONS, "
                        "else ~/.local/share/llm-serving-sim/calibrations, where the simulator looks)")
    p.add_argument("--name", type=calibration_name, default=None,
                   help="the calibration's name (default the GPU's preset, e.g. h200; cpu on a CPU)")
    p.add_argument("--no-charts", action="store_true", help="skip the fit's residual charts")
    try:
        args = p.parse_args(argv)
        from engine.provenance import resolve_device
        device = resolve_device(args.device)
        gpu = device.type == "cuda"
        model = args.model or ("qwen2.5-1.5b" if gpu else "tiny")
        if model not in PRESETS:  # (the fit files a calibration under a preset's name)
            raise ValueError(f"--model: unknown model preset {model!r}; calibrate run takes one of "
                             f"{', '.join(PRESETS)} (a config.json's model cannot be calibrated yet)")
        results = args.results or REPO / ("results" if gpu else "out/results")
        check_writable_dir(results, "--results")
        if args.out is not None:
            check_writable_dir(args.out, "--out")
    except ValueError as e:  # (UsageError included)
        print(f"error: {e}", file=sys.stderr)
        return 2
    dtype = args.dtype or ("float16" if gpu else "float32")
    common = ["--model", model, "--device", args.device, "--dtype", dtype, "--out", str(results)]
    # on a CPU (a smoke run): the least grid the fit can stand on, each shape timed once, short rests
    repeats = ["--repeats", "1"] if not gpu else ["--repeats", "2"] if args.quick else []
    # the grid's contexts and chunks, each up to --max-context, add up within the model's positions
    context = resolve_model(model).context_length
    fits = [] if context >= 32768 or not gpu else ["--max-context", str(context // 2)]
    sweep = common + (["--quick"] if args.quick else []) + repeats + (fits if gpu else CPU_GRID)
    # (a heat run measures how a GPU's prompt work slows it: a CPU's is skipped, its fit takes the
    # heat from the sweep's own stream of passes)
    # (two rounds of the heat's sequences, not `calibrate heat`'s three: the 8B's calibration was fitted
    # on two, and with them an 8B's run is under 10 minutes on an H200)
    heat = common + ["--repeats", "1" if args.quick else "2"] if gpu else None
    scale = heat_scale(model) if gpu else 1.0
    if scale < 1.0:
        heat += ["--scale", f"{scale:.3g}"]
    print(estimate(model, sweep, heat, gpu), flush=True)
    store = RunStore(results / "calibration")
    before = {r["run_id"] for r in store.rows()}
    started = time.perf_counter()
    for step, step_argv in (("sweep", sweep), ("heat", heat)):
        if step_argv is None:
            print(f"\n== calibrate {step}: skipped on a CPU", flush=True)
            continue
        failed = step_failed(step, step_argv)
        if failed:
            return failed
    new = [r for r in store.rows() if r.get("kind") == "sweep" and r["run_id"] not in before]
    if not new:
        print(f"error: calibrate run: the sweep step wrote no sweep under {store.root}", file=sys.stderr)
        return 2
    row = new[-1]
    from sim.cost import gpu_preset, user_calibrations
    name = args.name or gpu_preset(row.get("gpu", ""))[0] or ("cpu" if row.get("device") == "cpu" else "gpu")
    # the committed calibration's form (its --serving-heat needs open runs of the card: `fit` it after
    # them); on a CPU, whose sweep runs no CUDA graph and no batch that fills a GPU, the waves' form
    fit = (["--results", str(results), "--model", model, "--sweep", row["run_id"], "--name", name]
           + (["--schedule", "--mixed"] if gpu else ["--no-heat-run"])
           + (["--out", str(args.out)] if args.out else []) + (["--no-charts"] if args.no_charts else []))
    failed = step_failed("fit", fit)
    if failed:
        return failed
    path = (args.out or user_calibrations()) / model / f"{name}.json"
    try:
        doc = json.loads(path.read_text())
        from calibrate.fit import ErrorRow, format_errors
        report = format_errors([ErrorRow(**e) for e in doc["error"]])
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: calibrate run: the fit step left no readable calibration at {path} ({e})", file=sys.stderr)
        return 2
    preset = gpu_preset(row.get("gpu", ""))[0]
    use = (f"python -m sim run --model {model}" + (f" --gpu {preset}" if preset != "h200" else "")
           + (f" --cost calibrated:{name}" if name != preset else "") + " uses it" if preset else
           f"measured on {row.get('gpu')}, which no GPU preset describes: the simulator, which sizes a GPU's KV "
           "cache, does not use it (a smoke run's)")
    print(f"\ncalibrated {model} on {row.get('gpu')} in {(time.perf_counter() - started) / 60:.1f} min: {path}\n"
          f"{use}\nthe fit's error on the shapes it was not fitted on (held-out) and on its own (fitted):\n{report}")
    return 0


def step_failed(step: str, argv: list[str]) -> int:
    """Run one step (`run_step`); 0 when it succeeded, else say which step failed, and why, in one
    line and return 2."""
    print(f"\n== calibrate {step} " + " ".join(argv), flush=True)
    code, error = run_step(step, argv)
    if code == 0:
        return 0
    why = error or f"exit status {code}, its output above"
    print(f"error: calibrate run: the {step} step failed: {why}; no calibration was written", file=sys.stderr)
    return 2


def run_step(step: str, argv: list[str]) -> tuple[int, str | None]:
    """`python -m calibrate STEP ARGV...` in a process of its own (the GPU's memory is the
    system's again once it ends), its output passed through as it comes, except its `error:`
    line, which is returned with its exit status for `calibrate run` to name the step in its
    own. The seam the tests of `calibrate run` replace (a real sweep, heat run and fit take
    minutes)."""
    import subprocess
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-m", "calibrate", step, *argv], stderr=subprocess.PIPE, env=env)
    try:
        error = pass_through(proc.stderr, sys.stderr)
        return proc.wait(), error
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def pass_through(stream, out) -> str | None:
    """Copy `stream` (bytes) to `out` (text) piece by piece (a line, or a progress bar's update up to
    its carriage return) as it comes, but for `error: ` lines; the last of those, without the prefix."""
    error, pending = None, b""

    def emit(piece: bytes) -> None:
        nonlocal error
        if piece.startswith(b"error: "):
            error = piece.decode(errors="replace").strip()[len("error: "):]
        else:
            out.write(piece.decode(errors="replace"))
            out.flush()
    while chunk := stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536):
        pending += chunk
        while True:
            cuts = [i for i in (pending.find(b"\n"), pending.find(b"\r")) if i >= 0]
            if not cuts:
                break
            emit(pending[:min(cuts) + 1])
            pending = pending[min(cuts) + 1:]
    if pending:
        emit(pending)
    return error


def estimate(model: str, sweep_argv: list[str], heat_argv: list[str], gpu: bool) -> str:
    """The run's plan and its time, estimated: the sweep's and heat run's passes priced by the
    committed H200 calibration projected to the model (and to this machine's card when a GPU preset
    describes it), a sweep's host time a pass, each step's start, the fit's least squares."""
    from calibrate.response import CPU_SHAPES, segments
    from calibrate.sweep import default_shapes, quick_shapes
    sweep = argparse.ArgumentParser(add_help=False)
    for flag, kind in (("--repeats", int), ("--max-batch", int), ("--max-context", int), ("--rest", float)):
        sweep.add_argument(flag, type=kind, default=None)
    sweep.add_argument("--quick", action="store_true")
    sweep.add_argument("--scale", type=float, default=1.0)
    s, _ = sweep.parse_known_args(sweep_argv)
    h, _ = sweep.parse_known_args(heat_argv or [])
    config = resolve_model(model)
    max_batch, max_context = s.max_batch or 1024, min(s.max_context or 16384, config.context_length)
    held = held_on_h200(config) if gpu else 20_000
    shapes = default_shapes(max_batch, max_context, max_tokens_held=held)
    shapes = quick_shapes(shapes, max_batch) if s.quick else shapes
    repeats, heat_repeats, rest = s.repeats or 3, h.repeats or 3, 1.5 if h.rest is None else h.rest
    plan = heat_plan(h.scale, held) if gpu else segments(0.02, **CPU_SHAPES)
    head = (f"calibrate run: {model} on {'the GPU' if gpu else 'the CPU'}: sweep {len(shapes)} shapes x "
            f"({repeats} timed + 1 warm-up), " + (f"heat {len(plan)} sequences x {heat_repeats}" if heat_argv else
                                                  "no heat run (a GPU's)") + ", then the fit")
    if not gpu:
        return head + "; no time estimate on a CPU (the estimate prices passes on a GPU): a smoke run, minutes"
    card, name = cuda_card()
    cost = priced_on(model, card)

    priced: dict = {}

    def busy(shape_list) -> float:  # (the heat's sequences repeat a few shapes thousands of times)
        for q in set(shape_list) - set(priced):
            priced[q] = cost.pass_time([n for _, n in q.seqs], [c for c, _ in q.seqs])
        return sum(priced[q] for q in shape_list)
    sweep_s = STEP_START_S + (repeats + 1) * (busy(shapes) + SWEEP_PASS_HOST_S * len(shapes))
    heat_s = STEP_START_S + heat_repeats * sum(rest + busy(seq) for _, seq in plan)
    fit_s = FIT_S_PER_PASS * len(shapes) * repeats
    on = card.name if card is not None and card.name == name else f"an H200 ({name or 'this card'} has no GPU preset)"
    return (head + f"; estimated {(sweep_s + heat_s + fit_s) / 60:.0f} min on {on}: sweep {sweep_s / 60:.1f}, "
            f"heat {heat_s / 60:.1f}, fit {fit_s / 60:.1f} (passes priced by the H200 calibration"
            + (f" projected to {model}" if cost.projected_from else "")
            + "; the fit's share depends on this host's CPU)")


def held_on_device(config, device, dtype) -> int:
    """The cached positions that the GPU's free memory holds beside what is loaded (the sweep's and
    the heat run's bound; `held_on_h200` is the estimate's)."""
    import torch

    from calibrate.sweep import tokens_that_fit
    return tokens_that_fit(config, torch.cuda.mem_get_info(device)[0], torch.finfo(dtype).bits // 8)


def held_on_h200(config) -> int:
    """The cached positions that fit beside `config`'s fp16 weights on an H200 (the estimate's;
    the steps measure the GPU's free memory)."""
    from calibrate.sweep import GRID_TOKENS_HELD, tokens_that_fit
    return min(GRID_TOKENS_HELD, tokens_that_fit(config, get_gpu("h200").memory_gb * 1e9 - config.weight_bytes(2) - 2**30))


def heat_plan(scale: float, held: int) -> list:
    """The heat run's sequences at `scale`, less those that hold more than `held` positions (as
    `calibrate heat` leaves them out)."""
    from calibrate.response import segments
    return [(name, seg) for name, seg in segments(scale) if all(q.tokens_held <= held for q in seg)]


def heat_scale(model: str) -> float:
    """The heat run's scale for `model`: its sequences' pass counts cut so that they keep about
    the 1.5B's busy time on the same GPU (at most 1), priced by the committed H200 calibration
    projected to the model."""
    base, config = "qwen2.5-1.5b", resolve_model(model)
    if model == base:
        return 1.0
    held = held_on_h200(config)
    costs = {m: priced_on(m, None) for m in (base, model)}
    busy = {m: sum(costs[m].pass_time([n for _, n in q.seqs], [c for c, _ in q.seqs])
                   for _, seg in heat_plan(1.0, held) for q in seg) for m in costs}
    return min(1.0, busy[base] / busy[model])


def cuda_card() -> tuple:
    """(the GPU preset, the name) of this machine's first GPU as nvidia-smi names it, without a CUDA
    context in this process (its memory stays the steps'); (None, None) when it cannot tell."""
    import subprocess
    from sim.cost import gpu_preset
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20).stdout.splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError, IndexError):
        return None, None
    return gpu_preset(name)[1], name


def priced_on(model: str, card):
    """The committed H200 calibration, projected to `model` and to `card` (a GPU preset, or None)."""
    from sim.calibrated import CalibratedCost
    from sim.cost import find_calibration
    h200 = get_gpu("h200")
    cost = CalibratedCost.from_json(find_calibration("h200", "qwen2.5-1.5b"))
    if model != cost.model:
        cost = cost.projected_to_model(resolve_model(cost.model), resolve_model(model), h200)
    return cost if card is None or card.name == h200.name else cost.projected(card, h200)


COMMANDS = {"sweep": ("on a GPU: time the engine's passes over a grid of shapes (runs under OUT/calibration/)",
                      sweep_main),
            "heat": ("on a GPU: how prompt work slows the passes after it (a heat run under OUT/calibration/)",
                     heat_main),
            "fit": ("fit the simulator's cost model on a sweep: the calibration where the simulator finds it, "
                    "MODEL-NAME-errors.csv and charts beside the sweep", fit_main),
            "run": ("sweep, heat and fit in one command, each in its own process, for --model on this GPU; "
                    "the held-out error at the end (--quick: a reduced grid)", run_main)}


def main(argv: list[str] | None = None) -> int:
    """`python -m calibrate COMMAND ...`: the sub-command's own main runs the rest of the line."""
    return run_subcommand("python -m calibrate", __doc__, COMMANDS, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
