"""benchmarks/report.py: the results table reads every engine's rows, the closed ones only."""
import json
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_report(args, capsys):
    argv = sys.argv
    sys.argv = ["report.py", *args]
    try:
        with pytest.raises(SystemExit) as done:
            runpy.run_path(str(ROOT / "benchmarks" / "report.py"), run_name="__main__")
    finally:
        sys.argv = argv
    return done.value.code, capsys.readouterr()


def test_committed_results_table_has_continuous_rows_and_skips_open_runs(capsys):
    code, out = run_report(["--results", str(ROOT / "results")], capsys)
    assert code == 0, out.err
    lines = out.out.splitlines()
    assert any(line.startswith("| continuous | graph | decode p256 x256 |") for line in lines)
    assert any(line.startswith("| cached | graph+pdl | decode p256 x1 |") for line in lines)
    assert not any("seed-r" in line or "sweep-" in line for line in lines)


def test_results_with_only_open_runs_is_a_one_line_error(tmp_path, capsys):
    d = tmp_path / "continuous"
    d.mkdir()
    (d / "runs.jsonl").write_text(json.dumps({"run_id": "seed-r1", "gpu": "NVIDIA H200", "engine": "continuous"}) + "\n")
    code, out = run_report(["--results", str(tmp_path)], capsys)
    assert code == 2
    assert out.err.startswith("error: no rows measured on a GPU")


def test_a_case_measured_again_shows_its_latest_measurement_and_its_commit(tmp_path, capsys):
    """The batched engine's batch 2 measured at two commits (the second on the small-batch kernels,
    its mode named differently): one row, the second measurement's median, its commit."""
    d = tmp_path / "batched"
    d.mkdir()
    rows = []
    for stamp, commit, mode, itl in (("20261130T010000.000Z", "aaaaaaa1", "graph+pdl", 1.72),
                                     ("20261204T144832.820Z", "bbbbbbb2", "graph", 1.56)):
        for run in range(3):
            rows.append({"run_id": f"batched-p256-b2-r{run}-{stamp}", "engine": "batched", "mode": mode,
                         "prompt": "p256", "prompt_tokens": 256, "new_tokens": 256, "batch_size": 2, "status": "ok",
                         "gpu": "NVIDIA H200", "git_commit": commit, "mean_itl_ms": itl + run * 0.001,
                         "mean_ttft_ms": 3.4})
    (d / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out = run_report(["--results", str(tmp_path)], capsys)
    assert code == 0, out.err
    lines = [line for line in out.out.splitlines() if "decode p256 x2" in line]
    assert lines == [lines[0]] and lines[0].startswith("| batched | graph | decode p256 x2 | 1.561 |")
    assert lines[0].endswith("| bbbbbbb |")
