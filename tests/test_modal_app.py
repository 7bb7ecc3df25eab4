"""modal_app.py without Modal's cloud: the module imports, its function body runs on the CPU with
the tiny preset, and pulled-back rows are appended to results/ without losing any."""
import pytest
pytest.importorskip("torch", reason="the engine's tests need the engine extra (torch)")
import json


pytest.importorskip("modal")
import modal_app  # noqa: E402

ARGS = ["--engine", "cached", "--prompts", "p16", "--model", "tiny", "--device", "cpu",
        "--new-tokens", "3", "--warmup", "0", "--runs", "2"]


def test_the_app_defines_the_seeds_entrypoints_and_a_gpu_function():
    import modal

    assert modal_app.app.name == "llm-serving-sim"
    for entrypoint in (modal_app.main, modal_app.arrivals, modal_app.calibrate):
        assert isinstance(entrypoint, modal.app.LocalEntrypoint)
    assert isinstance(modal_app.on_gpu, modal.Function)


def test_function_body_runs_the_harness_and_records_the_commit(tmp_path):
    stamp = modal_app.benchmark_body(ARGS, tmp_path, git_commit="abc123")
    rows = [json.loads(l) for l in (tmp_path / stamp / "cached" / "runs.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["git_commit"] == "abc123" and r["status"] == "ok" for r in rows)


def test_function_body_reports_a_failing_benchmark(tmp_path):
    with pytest.raises(RuntimeError, match="exit code 2"):
        modal_app.benchmark_body(ARGS + ["--engine", "nope"], tmp_path)


def test_pulled_back_rows_are_appended_not_overwritten(tmp_path):
    first = modal_app.benchmark_body(ARGS, tmp_path / "volume")
    second = modal_app.benchmark_body(ARGS, tmp_path / "volume2")
    dest = tmp_path / "results"
    modal_app.merge_results(tmp_path / "volume" / first, dest)
    with pytest.raises(ValueError, match="exists already"):  # the same runs twice: refused
        modal_app.merge_results(tmp_path / "volume" / first, dest)
    modal_app.merge_results(tmp_path / "volume2" / second, dest)
    assert len((dest / "cached" / "runs.jsonl").read_text().splitlines()) == 4
    csv_lines = (dest / "cached" / "runs.csv").read_text().splitlines()
    assert len(csv_lines) == 5 and csv_lines[0].startswith("engine,")
    from core.runstore import RunStore
    store = RunStore(dest / "cached")
    assert all(len(store.passes(r["run_id"])) == 3 for r in store.rows()[:2])


def test_arrivals_body_runs_an_open_run_and_merges_it(tmp_path):
    stamp = modal_app.command_body("serve-trace", ["--rates", "50", "--requests", "3", "--output-tokens", "3",
                                                   "--model", "tiny", "--device", "cpu"], tmp_path / "volume", "abc123")
    dest = tmp_path / "results"
    modal_app.merge_results(tmp_path / "volume" / stamp, dest)
    from core.runstore import RunStore
    store = RunStore(dest / "continuous")
    (row,) = store.rows()
    assert row["git_commit"] == "abc123" and row["completed"] == 3
    assert len(store.requests(row["run_id"])) == 3


def test_sweep_body_writes_a_calibration_sweep(tmp_path):
    stamp = modal_app.command_body("sweep", ["--model", "tiny", "--device", "cpu", "--max-batch", "2",
                                             "--max-context", "32", "--repeats", "1"], tmp_path)
    from core.runstore import RunStore
    (row,) = RunStore(tmp_path / stamp / "calibration").rows()
    assert row["passes"] > 0 and len(RunStore(tmp_path / stamp / "calibration").passes(row["run_id"])) == row["passes"]


def test_heat_body_writes_a_heat_run(tmp_path):
    stamp = modal_app.command_body("heat", ["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--repeats", "1",
                                            "--rest", "0"], tmp_path)
    from core.runstore import RunStore
    (row,) = RunStore(tmp_path / stamp / "calibration").rows()
    assert row["kind"] == "heat" and row["segments"]


def test_unknown_command_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown command"):
        modal_app.command_body("rm", [], tmp_path)


def test_merge_takes_rows_with_new_columns(tmp_path):
    from core.runstore import RunStore
    RunStore(tmp_path / "a" / "continuous").append_row({"run_id": "one", "x": 1})
    RunStore(tmp_path / "b" / "continuous").append_row({"run_id": "two", "x": 2, "y": 3})
    dest = tmp_path / "results"
    modal_app.merge_results(tmp_path / "a", dest)
    modal_app.merge_results(tmp_path / "b", dest)
    assert [r["run_id"] for r in RunStore(dest / "continuous").rows()] == ["one", "two"]
    assert (dest / "continuous" / "runs.csv").read_text().splitlines()[0] == "run_id,x,y"


def test_calibrate_runs_calibrate_run_on_the_gpu_asked_for_and_brings_the_calibration_home(tmp_path, monkeypatch):
    """`modal run modal_app.py::calibrate --model NAME --gpu A100 [--quick]`, wired without Modal's
    cloud: the function body runs `python -m calibrate run` (its steps stubbed, as in
    test_calibrate_run) under the invocation's directory, and the pull-back puts the calibration
    in the user's calibrations folder and the runs under results/."""
    import inspect

    import calibrate.__main__ as cli
    from core.runstore import RunStore
    from tests.test_calibrate_run import Steps
    assert list(inspect.signature(modal_app.calibrate.info.raw_f).parameters) == ["model", "gpu", "quick"]
    assert modal_app.on_gpu.with_options(gpu="A100") is not None  # Modal's card, chosen per call
    import torch

    import engine.provenance
    monkeypatch.setattr(engine.provenance, "resolve_device", lambda name: torch.device("cuda"))  # as in the container
    monkeypatch.setattr(cli, "cuda_card", lambda: (None, None))  # (no nvidia-smi asked here)
    steps = Steps(gpu="NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(cli, "run_step", steps)
    stamp = modal_app.command_body("run", modal_app.calibrate_argv("tiny", quick=True), tmp_path / "volume", "abc")
    assert [s for s, _ in steps.calls] == ["sweep", "heat", "fit"]
    sweep = steps.calls[0][1]
    assert "--quick" in sweep and sweep[sweep.index("--model") + 1] == "tiny"
    assert sweep[sweep.index("--out") + 1] == str(tmp_path / "volume" / stamp)
    home = tmp_path / "home-calibrations"
    written = modal_app.pull_calibrations(tmp_path / "volume" / stamp, home)
    assert written == [home / "tiny" / "a100-80gb.json"]  # named for the card's preset
    assert json.loads(written[0].read_text())["model"] == "tiny"
    modal_app.merge_results(tmp_path / "volume" / stamp, tmp_path / "results")
    assert [r["run_id"] for r in RunStore(tmp_path / "results" / "calibration").rows()] == ["sweep-new"]
    assert not (tmp_path / "results" / modal_app.CALIBRATIONS).exists()
