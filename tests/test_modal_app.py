"""modal_app.py without Modal's cloud: the module imports, its function body runs on the CPU with
the tiny preset, and pulled-back rows are appended to results/ without losing any."""
import pytest
pytest.importorskip("torch", reason="the engine's tests need the engine extra (torch)")
import json


pytest.importorskip("modal")
import modal_app  # noqa: E402

ARGS = ["--engine", "cached", "--prompts", "p16", "--model", "tiny", "--device", "cpu",
        "--new-tokens", "3", "--warmup", "0", "--runs", "2"]


def test_the_app_defines_the_seeds_entrypoint_and_a_gpu_function():
    import modal

    assert modal_app.app.name == "llm-serving-sim"
    assert isinstance(modal_app.main, modal.app.LocalEntrypoint)
    assert isinstance(modal_app.benchmark, modal.Function)


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
