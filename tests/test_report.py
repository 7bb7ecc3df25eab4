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
