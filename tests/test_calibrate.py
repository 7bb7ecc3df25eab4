"""Calibration: the fit recovers known parameters, errors are reported on held-out shapes, bad
pass logs are refused, and a sweep on the CPU writes the records the fit reads."""
import json

import numpy as np
import pytest

pytest.importorskip("torch", reason="calibrate sits above the engine (its sweep's grid is the engine's shapes)")

from calibrate.__main__ import main, placeholder  # noqa: E402
from calibrate.fit import (Design, constants, error_table, fit_params, fit_schedule, group_of, held_out,  # noqa: E402
                           predict, skeleton)
from calibrate.mixtures import fit_spread, pairs, shape_medians  # noqa: E402
from calibrate.sweep import default_shapes, mixture_shapes  # noqa: E402
from core.config import get_preset  # noqa: E402
from core.records import PassRecord, pass_kind  # noqa: E402
from core.runstore import RunStore  # noqa: E402
from sim.calibrated import MIXED, bucket  # noqa: E402
from sim.cost import FORMAT, CalibratedCost, parse_cost  # noqa: E402

MODEL = get_preset("qwen2.5-1.5b")
BUCKETS = [1, 2, 4] + list(range(8, 513, 8))
TOKEN_BUCKETS = [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
ATTENTION = {"kv_heads": 2, "fills_gpu": 256, "block_n": 64, "small": [64, 128], "big": [16, 1024]}
GRAPH = {str(b): 1.6e-3 + 3e-6 * b for b in BUCKETS}
CHUNK = {"tile_tokens": 21}
WAVES = {"sms": 132, "decode_programs_per_sm": 4, "prefill_programs_per_sm": 1}
TRUE = {"decode1": {"fixed_s": 1.2e-3, "serial_s_per_token": 9e-7, "merge_s": 9e-6},
        "decode": {"graph_s": GRAPH,
                   "small": {"kv_gbs": 4200.0, "block_s": 3.5e-6, "merge_s": 9e-6, "program_s": 1.3e-7, "tail": 0.8},
                   "big": {"kv_gbs": 4500.0, "block_s": 6e-5, "merge_s": 3e-5, "program_s": 6e-8, "tail": 0.7}},
        "prefill": {"fixed_s": 1.1e-3, "weight_gbs": 4300.0, "matmul_tflops": 760.0, "eager_s": 4e-3,
                    "block_s": 5e-5, "program_s": 2e-5, "shared": 0.85, "per_seq_s": 5e-6}}
C = constants(MODEL)
BASE = skeleton({"model": MODEL.name, "gpu": "NVIDIA H200"}, C, BUCKETS, TOKEN_BUCKETS, ATTENTION, CHUNK, WAVES)
SHAPE = CalibratedCost(BASE | {"parameters": placeholder(BASE)})


def synthetic_passes(params=TRUE, noise=0.0, repeats=2, seed=0):
    """Passes of the sweep's shapes timed by a known model (and some noise)."""
    cost = CalibratedCost(BASE | {"parameters": params})
    rng = np.random.default_rng(seed)
    passes = []
    for shape in default_shapes(512, 16384, seed=seed):
        new, ctx = [n for _, n in shape.seqs], [c for c, _ in shape.seqs]
        for _ in range(repeats):
            d = cost.pass_time(new, ctx) * (1 + noise * rng.standard_normal())
            passes.append(PassRecord(run_id="sweep-x", engine="continuous", step=len(passes), kind=pass_kind(new, ctx),
                                     new_tokens=new, context_lens=ctx, start_s=0.0, duration_s=d))
    return passes


def flat(params: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in params.items():
        out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def test_the_fit_recovers_known_parameters_within_1_percent():
    passes = synthetic_passes()
    params = flat(fit_params(passes, C, SHAPE))
    timed = {str(b) for b in {SHAPE.buckets[0]} | {p for p in params}}  # noqa: F841 (the buckets the sweep timed)
    for name, value in flat(TRUE).items():
        if name in params:
            assert params[name] == pytest.approx(value, rel=0.01), name
    fitted_graphs = [k for k in params if k.startswith("decode.graph_s.")]
    assert len(fitted_graphs) >= 20  # every bucket the sweep timed has its own graph time
    got = CalibratedCost(BASE | {"parameters": fit_params(passes, C, SHAPE)}).predict_all(passes)
    assert np.allclose(got, [p.duration_s for p in passes], rtol=1e-3)


def test_the_fit_recovers_a_smoothed_ridge_between_the_weight_read_and_the_arithmetic():
    """prefill.smooth = k: a pass's projections take the k-norm of the weight read and the
    arithmetic, not the larger of them; the fit finds k and the rates beside it."""
    true = json.loads(json.dumps(TRUE))
    true["prefill"]["smooth"] = 2.5
    passes = synthetic_passes(true)
    params = fit_params(passes, C, SHAPE)
    for name in ("smooth", "weight_gbs", "matmul_tflops", "fixed_s"):
        assert params["prefill"][name] == pytest.approx(true["prefill"][name], rel=0.02), name
    plain = CalibratedCost(BASE | {"parameters": TRUE})
    smooth = CalibratedCost(BASE | {"parameters": true})
    ridge = [256], [0]  # near where the weight read and the arithmetic take alike (0.72 and 1.0 ms)
    assert smooth.pass_time(*ridge) > plain.pass_time(*ridge) * 1.05


def test_held_out_shapes_are_whole_groups_and_the_error_table_reads_them():
    passes = synthetic_passes(noise=0.01)
    split = ["held-out" if held_out(group_of(p), BUCKETS) else "fitted" for p in passes]
    by_group = {}
    for p, s in zip(passes, split):
        by_group.setdefault(group_of(p), set()).add(s)
    assert all(len(s) == 1 for s in by_group.values())  # never a group on both sides
    assert 0.1 < split.count("held-out") / len(split) < 0.6
    train = [p for p, s in zip(passes, split) if s == "fitted"]
    params = fit_params(train, C, SHAPE)
    predicted = CalibratedCost(BASE | {"parameters": params}).predict_all(passes)
    rows = error_table(passes, np.array(predicted), split)
    kinds = {(r.kind, r.split) for r in rows}
    assert {("decode", "held-out"), ("prefill", "held-out"), ("mixed", "held-out")} <= kinds
    for r in rows:  # 1% noise: about 0.8% mean absolute error, no group far off
        assert r.mape < 0.03 and abs(r.signed_median) < 0.015 and r.worst_group_mape < 0.06, r
    # and by hand, for one row
    sel = [(p, q) for p, q, s in zip(passes, predicted, split) if p.kind == "decode" and s == "held-out"]
    mape = np.mean([abs(q / p.duration_s - 1) for p, q in sel])
    row = next(r for r in rows if (r.kind, r.split) == ("decode", "held-out"))
    assert row.passes == len(sel) and row.mape == pytest.approx(mape)
    # the vectorised model the fit minimises is the simulator's
    fitted = [p for p, s in zip(passes, split) if s == "fitted"]
    assert np.allclose(predict(params, C, Design.of(fitted, SHAPE), SHAPE),
                       CalibratedCost(BASE | {"parameters": params}).predict_all(fitted), rtol=1e-12)


def test_missing_shapes_are_named():
    passes = [p for p in synthetic_passes() if len(p.new_tokens) < 64 or p.kind != "decode"]
    with pytest.raises(ValueError, match="decode batches of 64 or more"):
        fit_params(passes, C, SHAPE)
    with pytest.raises(ValueError, match="too few passes to fit the decode1 regime"):
        fit_params([p for p in synthetic_passes() if len(p.new_tokens) > 1], C, SHAPE)


def write_sweep(root, passes, **row):
    store = RunStore(root / "calibration")
    meta = {"run_id": "sweep-x", "engine": "continuous", "kind": "sweep", "model": MODEL.name, "gpu": "NVIDIA H200",
            "dtype": "float16", "git_commit": "abc", "torch": "2.11", "block_size": 16, "graph_buckets": BUCKETS,
            "token_buckets": TOKEN_BUCKETS, "decode_attention": ATTENTION, "chunk_attention": CHUNK, "sms": 132}
    store.write_run("sweep-x", passes, [], meta | row)
    return store


def test_fit_writes_a_calibration_the_simulator_loads(tmp_path, capsys, monkeypatch, user_calibrations):
    """... with the spread term from a mixtures run of the same GPU and model (not another's): fitted
    on what the form without it leaves of the pairs' differences (here all of the term)."""
    truth = with_spread(TRUE)
    store = write_sweep(tmp_path, synthetic_passes(noise=0.005, repeats=1))
    mixtures = RunStore(tmp_path / "calibration")  # where `calibrate sweep --grid mixtures` writes them
    meta = {"engine": "continuous", "kind": "sweep-mixtures", "model": MODEL.name, "gpu": "NVIDIA H200"}
    mixtures.write_run("sweep-mixtures-x", mixture_passes(truth), [], meta | {"run_id": "sweep-mixtures-x"})
    other = mixture_passes(with_spread(TRUE, {"small": 1e-6, "big": 0.0}))  # another card's: not read
    mixtures.write_run("sweep-mixtures-y", other, [], meta | {"run_id": "sweep-mixtures-y", "gpu": "NVIDIA A10"})
    assert main(["fit", "--results", str(tmp_path), "--name", "h200", "--spread", "--schedule", "--mixed"]) == 0
    out = capsys.readouterr().out
    assert "held-out" in out and "matmul" in out and "TFLOP/s" in out and "the roofline alone" in out
    assert "spread term: fitted on 50 pairs" in out
    doc = json.loads((user_calibrations / MODEL.name / "h200.json").read_text())
    assert doc["spread_fitted_on"] == ["sweep-mixtures-x"]
    decode = doc["parameters"]["decode"]
    assert set(decode["schedule"]) == {"kv_gbs", "block_s", "start_s"} and "as scheduled (sim.schedule)" in out
    assert set(doc["parameters"]["mixed"]) == set(MIXED) and "tiles list-scheduled" in out
    assert decode["spread_from"] == 24.0
    # (the form the term is fitted against is itself fitted on passes scattered by 0.5%, which moves
    # a pair's difference of a few percent of its time by a tenth or so of itself)
    assert decode["small"]["spread_s"] == pytest.approx(SPREAD["small"], rel=0.2)
    assert decode["big"]["spread_s"] == 0.0
    assert doc["format"] == FORMAT and doc["sweep"] == "sweep-x" and doc["engine_commit"] == "abc"
    assert {e["kind"] for e in doc["error"]} == {"decode", "prefill", "mixed"}
    stem = f"{MODEL.name}-h200"
    assert (store.root / f"{stem}-errors.csv").exists() and (store.root / f"{stem}-residuals.png").stat().st_size > 1000
    cost, gpu = parse_cost("calibrated:h200")
    assert gpu.name == "NVIDIA H200"
    assert cost.pass_time([1], [500]) == pytest.approx(CalibratedCost(doc).pass_time([1], [500]))
    projected, a10 = parse_cost("calibrated:h200@a10")
    assert a10.name == "NVIDIA A10" and projected.pass_time([1], [500]) > 4 * cost.pass_time([1], [500])


@pytest.mark.parametrize("row, args, message", [
    ({"engine": "batched"}, [], "timed the 'batched' engine"),
    ({}, ["--model", "tiny"], "no sweep of --model tiny"),
    ({}, ["--sweep", "sweep-x", "--model", "tiny"], "timed 'qwen2.5-1.5b', not --model 'tiny'"),
    ({}, ["--gpu", "a10"], "ran on 'NVIDIA H200', not --gpu a10"),
    ({}, ["--sweep", "sweep-y"], "no such sweep"),
    ({}, ["--spread"], "--spread: no `calibrate sweep --grid mixtures` run of qwen2.5-1.5b on NVIDIA H200"),
    ({}, ["--serving-heat"], "--serving-heat: no open runs' passes to fit the heat's slow-downs on"),
])
def test_a_pass_log_from_another_engine_model_or_gpu_is_refused(tmp_path, capsys, row, args, message):
    write_sweep(tmp_path, synthetic_passes(), **row)
    assert main(["fit", "--results", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err


def test_the_latest_sweep_is_the_latest_of_the_model_asked_for(tmp_path, capsys):
    """One folder holds several models' sweeps: `--model` picks that model's latest, not a later
    sweep of another model (the 8B's sweep came after the 1.5B's)."""
    store = write_sweep(tmp_path, synthetic_passes())
    store.append_row({"run_id": "sweep-8b", "engine": "continuous", "kind": "sweep", "model": "llama-3.1-8b",
                      "gpu": "NVIDIA H200"})
    assert main(["fit", "--results", str(tmp_path), "--serving-heat"]) == 2
    assert "sweep 'sweep-8b' lacks" in capsys.readouterr().err
    assert main(["fit", "--results", str(tmp_path), "--model", MODEL.name, "--serving-heat"]) == 2
    assert "--serving-heat: no open runs' passes" in capsys.readouterr().err  # (past the sweep's checks)


def with_duration(passes, i, duration):
    q = passes[i]
    passes[i] = PassRecord.make(q.run_id, q.engine, q.step, q.new_tokens, q.context_lens, q.start_s, duration)
    return passes


@pytest.mark.parametrize("passes, row, message", [
    (lambda: with_duration(synthetic_passes(), 3, -1.0), {}, "pass 3 (step 3) has duration_s -1.0"),
    (lambda: with_duration(synthetic_passes(), 0, float("nan")), {}, "pass 0 (step 0) has duration_s None"),  # NaN: JSON's null
    (lambda: synthetic_passes(), {"model": "tiny"}, "not a sweep of tiny"),  # Qwen's passes relabelled
    (lambda: synthetic_passes(), {"torch": None}, "lacks torch"),
])
def test_a_sweep_the_fit_cannot_stand_on_is_refused_and_nothing_is_written(tmp_path, capsys, user_calibrations,
                                                                             passes, row, message):
    write_sweep(tmp_path, passes(), **row)
    if row.get("torch", 1) is None:  # a runs table missing a field
        rows = tmp_path / "calibration" / "runs.jsonl"
        rows.write_text(json.dumps({k: v for k, v in json.loads(rows.read_text()).items() if k != "torch"}) + "\n")
    assert main(["fit", "--results", str(tmp_path), "--no-charts"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("error: ")
    assert not user_calibrations.exists() or not any(user_calibrations.rglob("*.json"))


def test_a_fit_that_fails_while_writing_leaves_the_old_calibration_and_errors_whole(tmp_path, user_calibrations,
                                                                                     monkeypatch):
    write_sweep(tmp_path, synthetic_passes(noise=0.005, repeats=1))
    old = user_calibrations / MODEL.name / "h200.json"
    errors = tmp_path / "calibration" / f"{MODEL.name}-h200-errors.csv"
    old.parent.mkdir(parents=True)
    old.write_text('{"old": 1}\n')
    errors.write_text("old errors\n")
    import core.atomic
    calls = []

    def killed_on_the_second(fd):  # the calibration's temporary file, after the errors' one
        calls.append(fd)
        if len(calls) == 2:
            raise KeyboardInterrupt
    monkeypatch.setattr(core.atomic.os, "fsync", killed_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        main(["fit", "--results", str(tmp_path), "--name", "h200", "--no-charts"])
    assert old.read_text() == '{"old": 1}\n' and errors.read_text() == "old errors\n"
    assert sorted(p.name for p in old.parent.iterdir()) == ["h200.json"]  # no temporary file left
    assert [p.name for p in errors.parent.iterdir() if p.name.endswith(".tmp")] == []


def write_open_run(root, run_id: str, seed: int, mixed_slower: float) -> list[PassRecord]:
    """An open run of the same GPU and model under ROOT/continuous: the sweep's passes shuffled end to
    end (decode passes after prompt passes too, at every level), each priced by the true form, each
    mixed pass `mixed_slower` times that."""
    cost = CalibratedCost(BASE | {"parameters": TRUE})
    served, t, order = [], 0.0, synthetic_passes(repeats=1, seed=seed)
    np.random.default_rng(seed + 1).shuffle(order)
    for i, p in enumerate(order):
        d = cost.pass_time(p.new_tokens, p.context_lens) * (mixed_slower if p.kind == "mixed" else 1.0)
        served.append(PassRecord.make(run_id, "continuous", i, p.new_tokens, p.context_lens, t, d))
        t += d
    row = {"run_id": run_id, "engine": "continuous", "status": "ok", "model": MODEL.name, "gpu": "NVIDIA H200"}
    RunStore(root / "continuous").write_run(run_id, served, [], row)
    return served


def test_fit_refits_the_heat_slow_downs_on_open_runs(tmp_path, capsys, user_calibrations):
    """--serving-heat: the sweep's passes shuffled end to end as an open run of the same GPU and model,
    each mixed pass 3% over the form's price: the mixed passes' slow-down takes it (at the level
    the passes before them leave), the heat run's fit (here the sweep's own) kept beside it."""
    store = write_sweep(tmp_path, synthetic_passes(repeats=1))
    served = write_open_run(tmp_path, "open-x", seed=1, mixed_slower=1.03)
    assert main(["fit", "--results", str(tmp_path), "--name", "h200", "--no-charts", "--serving-heat"]) == 0
    out = capsys.readouterr().out
    assert "slow-downs refitted on the open runs (--serving-heat; 1 runs" in out
    doc = json.loads((user_calibrations / MODEL.name / "h200.json").read_text())
    assert doc["heat"]["mixed"] > 0.0 and doc["heat_slopes_fitted_on"]["passes"] == len(served)
    assert "mixed" not in doc["heat_run_fit"]
    assert {k: doc["heat"][k] for k in ("tau_s", "tau_up_s", "full_tokens")} == \
        {k: doc["heat_run_fit"][k] for k in ("tau_s", "tau_up_s", "full_tokens")}
    assert abs(doc["heat_slopes_fitted_on"]["after"]["mixed"]) < abs(doc["heat_slopes_fitted_on"]["before"]["mixed"])


def test_runs_of_reads_only_the_runs_a_calibration_read(tmp_path, capsys, user_calibrations):
    """The fit records the runs it read (`runs_read`); `--runs-of` that file reads those again and no
    run added since, so a refit reproduces the calibration; a run it names that is gone, or a file
    without the list, is an error naming it."""
    store = write_sweep(tmp_path, synthetic_passes(repeats=1))
    write_open_run(tmp_path, "open-x", seed=1, mixed_slower=1.03)
    args = ["fit", "--results", str(tmp_path), "--name", "h200", "--no-charts", "--serving-heat"]
    assert main(args) == 0
    first = json.loads((user_calibrations / MODEL.name / "h200.json").read_text())
    assert first["runs_read"] == {"continuous": ["open-x"], "continuous-closed": []}
    kept = tmp_path / "kept.json"
    kept.write_text((user_calibrations / MODEL.name / "h200.json").read_text())
    write_open_run(tmp_path, "open-y", seed=2, mixed_slower=1.10)  # measured after the calibration: held out of its refit
    capsys.readouterr()
    assert main(args + ["--runs-of", str(kept)]) == 0
    again = json.loads((user_calibrations / MODEL.name / "h200.json").read_text())
    assert again["runs_read"] == first["runs_read"] and again["heat"] == first["heat"]
    assert again["heat_slopes_fitted_on"]["runs"] == 1
    assert "is rewritten on other runs" not in capsys.readouterr().out
    assert main(args) == 0  # without it, every run, and a note that the file's runs changed
    both = json.loads((user_calibrations / MODEL.name / "h200.json").read_text())
    assert both["runs_read"]["continuous"] == ["open-x", "open-y"] and both["heat"]["mixed"] > first["heat"]["mixed"]
    assert "h200.json is rewritten on other runs than it was fitted on (1 more under continuous/)" in \
        capsys.readouterr().out
    kept.write_text(json.dumps(first | {"runs_read": {"continuous": ["open-x", "open-z"]}}))
    assert main(args + ["--runs-of", str(kept)]) == 2
    assert "1 of the runs asked for are not under" in capsys.readouterr().err
    kept.write_text(json.dumps({k: v for k, v in first.items() if k != "runs_read"}))
    assert main(args + ["--runs-of", str(kept)]) == 2
    assert "records no `runs_read`" in capsys.readouterr().err


def test_a_damaged_pass_log_names_the_line(tmp_path, capsys):
    store = write_sweep(tmp_path, synthetic_passes())
    import gzip
    path = store.run_dir("sweep-x") / "passes.jsonl.gz"
    data = gzip.decompress(path.read_bytes()).decode().splitlines()
    data[5] = data[5][:30]
    path.write_bytes(gzip.compress(("\n".join(data) + "\n").encode()))
    with pytest.warns(UserWarning, match=r"passes.jsonl.gz:6: not valid JSON"):
        assert main(["fit", "--results", str(tmp_path), "--no-charts"]) == 0


def test_a_sweep_on_the_cpu_times_every_shape(tmp_path):
    pytest.importorskip("torch", reason="the sweep runs the engine")
    assert main(["sweep", "--device", "cpu", "--max-batch", "3", "--max-context", "128", "--repeats", "2",
                 "--out", str(tmp_path)]) == 0
    store = RunStore(tmp_path / "calibration")
    row, = store.rows()
    passes = store.passes(row["run_id"])
    assert row["kind"] == "sweep" and row["engine"] == "continuous" and len(passes) == row["shapes"] * 2
    assert {p.kind for p in passes} == {"decode", "prefill", "mixed"}
    assert all(p.duration_s > 0 and p.mode == "eager" for p in passes)
    assert max(len(p.new_tokens) for p in passes if p.kind == "decode") == 3


SPREAD = {"small": 4e-8, "big": 0.0}  # (fit_spread fits the small slicing's alone)


def with_spread(params: dict, rates: dict = SPREAD, start: float = 24.0) -> dict:
    params = json.loads(json.dumps(params))
    params["decode"]["small"]["spread_s"], params["decode"]["big"]["spread_s"] = rates["small"], rates["big"]
    params["decode"]["spread_from"] = start
    return params


def mixture_passes(params: dict, seed: int = 0) -> list[PassRecord]:
    """The mixtures grid's spread batches and twins, timed by a known model, three times each."""
    cost = CalibratedCost(BASE | {"parameters": params})
    passes = []
    for shape in mixture_shapes(256, 16384, seed=seed) * 3:
        new, ctx = [n for _, n in shape.seqs], [c for c, _ in shape.seqs]
        passes.append(PassRecord(run_id="sweep-mixtures-x", engine="continuous", step=len(passes), kind="decode",
                                 new_tokens=new, context_lens=ctx, start_s=0.0, duration_s=cost.pass_time(new, ctx)))
    return passes


def test_the_spread_term_is_recovered_from_spread_batches_and_their_twins():
    """fit_spread, against the model without the term, finds the term that timed the pairs."""
    mix = [row for rows in pairs(shape_medians(mixture_passes(with_spread(TRUE)))).values() for row in rows]
    assert len(mix) == 50  # 40 of the small slicing
    start, rates, rms = fit_spread(mix, CalibratedCost(BASE | {"parameters": TRUE}))
    assert start == 24.0 and rms < 1e-9
    assert rates == pytest.approx(SPREAD, rel=1e-6)
    start, rates, _ = fit_spread(mix, CalibratedCost(BASE | {"parameters": with_spread(TRUE, start=0.0)}))
    assert start == 24.0 and rates == pytest.approx(SPREAD, rel=1e-6)  # the cost's own term is left out
    with pytest.raises(ValueError, match="no pairs"):
        fit_spread([], CalibratedCost(BASE | {"parameters": TRUE}))


def test_the_schedule_of_full_batches_is_recovered_from_their_passes():
    """fit_schedule finds the schedule's rates (and the graph times) that timed a sweep's decode
    passes of batches that fill the GPU, and leaves the smaller ones to the form."""
    truth = json.loads(json.dumps(TRUE))
    truth["decode"]["schedule"] = {"kv_gbs": 4700.0, "block_s": 8e-5, "start_s": 1.4e-4}
    passes = synthetic_passes(truth, repeats=1)
    params = fit_schedule(passes, fit_params(passes, C, SHAPE), SHAPE)
    assert params["decode"]["schedule"] == pytest.approx(truth["decode"]["schedule"], rel=0.01)
    got = CalibratedCost(BASE | {"parameters": params}).predict_all(passes)
    assert np.allclose(got, [p.duration_s for p in passes], rtol=1e-3)
    full = [p for p in passes if p.kind == "decode" and SHAPE.fills(len(p.new_tokens))]
    assert len(full) > 50
    with pytest.raises(ValueError, match="too few decode passes of batches that fill the GPU"):
        fit_schedule([p for p in passes if p not in full], params, SHAPE)


def test_the_mixed_passes_tiles_schedule_is_recovered_from_the_sweeps_passes():
    """mixed_fit finds the list-scheduled form's rates that timed the sweep's prompt and mixed
    passes (run as graphs), the tile's start among MIXED_STARTS."""
    from calibrate.fit import fit_mixed, mixed_fit
    truth = {"fixed_s": 1.2e-3, "weight_gbs": 5400.0, "matmul_tflops": 830.0, "per_seq_s": 5e-6, "block_s": 5e-5,
             "start_s": 1e-4}
    cost = CalibratedCost(BASE | {"parameters": TRUE | {"mixed": truth}})
    passes = [p for p in synthetic_passes(repeats=1) if p.kind != "decode"
              and not cost.eager(bucket(sum(p.new_tokens), cost.token_buckets))]
    for p in passes:  # every one of them timed by the list-scheduled form
        p.duration_s = cost.listed(bucket(sum(p.new_tokens), cost.token_buckets), p.new_tokens, p.context_lens, truth)
    assert sum(p.kind == "mixed" for p in passes) >= 12
    got = mixed_fit(passes, SHAPE, TRUE["prefill"])
    assert got == pytest.approx(truth, rel=0.01)
    params = fit_mixed(passes, TRUE, SHAPE)
    assert params["mixed"] == got and params["prefill"] == TRUE["prefill"]
    with pytest.raises(ValueError, match="too few mixed passes run as CUDA graphs"):
        mixed_fit([p for p in passes if p.kind != "mixed"], SHAPE, TRUE["prefill"])
