"""A sweep or a benchmark killed at any point leaves its folder whole (the old result, or the new
one so far), `--resume` completes it to what an uninterrupted run writes, and no worker outlives
its parent. Kills come from crash points (core/crash.py: LLMSIM_CRASH_AT), so no test waits on
the machine's speed; waits are on events (a process's exit, /proc), with generous timeouts."""
import csv
import io
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.records import read_jsonl
from core.runstore import RunStore

ROOT = Path(__file__).resolve().parent.parent
GRID = ["--policy", "continuous,chunked", "--rate", "10,20", "--limit", "30", "--cost", "roofline:h200"]
POINTS = 4


def run(args: list[str], crash: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LLMSIM_CRASH_AT"}
    if crash:
        env["LLMSIM_CRASH_AT"] = crash
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "trace.csv"
    rows = ["arrival_s,prompt_tokens,output_tokens"] + [f"{i * 0.05:.3f},{100 + 37 * i % 900},{5 + 13 * i % 60}"
                                                         for i in range(60)]
    path.write_text("\n".join(rows) + "\n")
    return path


def sweep(trace: Path, out: Path, *extra: str, crash: str | None = None) -> subprocess.CompletedProcess:
    return run(["sim", "sweep", "--trace", str(trace), *GRID, "--jobs", "1", "--out", str(out), *extra], crash)


@pytest.fixture(scope="module")
def whole(trace, tmp_path_factory) -> Path:
    """The folder an uninterrupted sweep writes."""
    out = tmp_path_factory.mktemp("whole") / "sweep"
    assert sweep(trace, out).returncode == 0
    return out


def runs_without_wall_time(path: Path) -> list[list[str]]:
    """runs.csv's cells, less wall_s (the one column that differs from one run to the next)."""
    rows = list(csv.reader(io.StringIO(path.read_text(), newline="")))
    keep = [i for i, name in enumerate(rows[0]) if name != "wall_s"]
    return [[row[i] for i in keep] for row in rows]


def assert_same_sweep(out: Path, whole: Path) -> None:
    assert (out / "summary.csv").read_bytes() == (whole / "summary.csv").read_bytes()
    assert runs_without_wall_time(out / "runs.csv") == runs_without_wall_time(whole / "runs.csv")
    assert (out / "sweep.json").read_bytes() == (whole / "sweep.json").read_bytes()


def data_rows(path: Path) -> int:
    return len(path.read_text().splitlines()) - 1


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("killed_after", [1, POINTS - 1])
def test_a_sweep_killed_after_a_row_keeps_its_rows_and_resumes_to_the_whole_result(trace, whole, tmp_path,
                                                                                  killed_after):
    out = tmp_path / "sweep"
    killed = sweep(trace, out, crash=f"sweep-row:{killed_after}")
    assert killed.returncode == -9, killed.stderr
    assert data_rows(out / "runs.csv") == killed_after
    assert not (out / "summary.csv").exists()  # no summary of rows that are not all there
    assert (out / "sweep.json").exists()
    resumed = sweep(trace, out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert_same_sweep(out, whole)


def test_a_last_row_cut_short_is_dropped_with_a_note_and_its_point_runs_again(trace, whole, tmp_path):
    out = tmp_path / "sweep"
    assert sweep(trace, out, crash="sweep-row:2").returncode == -9
    text = (out / "runs.csv").read_bytes()
    (out / "runs.csv").write_bytes(text[:-7])  # as if the disk filled in the middle of the second row
    resumed = sweep(trace, out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    notes = [line for line in resumed.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and str(out / "runs.csv") in notes[0] and "cut short" in notes[0]
    assert "Traceback" not in resumed.stderr
    assert_same_sweep(out, whole)


def test_resuming_with_other_options_is_refused_naming_each_and_writes_nothing(trace, tmp_path):
    out = tmp_path / "sweep"
    assert sweep(trace, out, crash="sweep-row:2").returncode == -9
    before = snapshot(out)
    other = tmp_path / "other.csv"
    shutil.copy(trace, other)
    refused = run(["sim", "sweep", "--trace", str(other), *GRID[:-4], "--limit", "20", "--cost", "roofline:h200",
                   "--jobs", "1", "--out", str(out), "--resume"])
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("error: --resume: ")
    assert f"--trace '{trace}' then, '{other}' now" in refused.stderr
    assert "--limit 30 then, 20 now" in refused.stderr
    assert snapshot(out) == before


def test_resuming_more_points_of_the_same_options_is_allowed(trace, tmp_path):
    out = tmp_path / "sweep"
    assert sweep(trace, out, crash="sweep-row:1").returncode == -9
    more = run(["sim", "sweep", "--trace", str(trace), "--policy", "continuous,chunked", "--rate", "10,20,40",
                "--limit", "30", "--cost", "roofline:h200", "--jobs", "1", "--out", str(out), "--resume"])
    assert more.returncode == 0, more.stderr
    assert data_rows(out / "runs.csv") == 6


def test_a_sweep_folder_without_its_record_is_not_resumed(trace, whole, tmp_path):
    out = tmp_path / "sweep"
    shutil.copytree(whole, out)
    (out / "sweep.json").unlink()
    before = snapshot(out)
    refused = sweep(trace, out, "--resume")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "has runs.csv but no sweep.json" in refused.stderr and "--overwrite" in refused.stderr
    assert snapshot(out) == before


@pytest.mark.parametrize("crash", ["sweep-overwrite", "sweep-row:1"])
def test_an_overwrite_killed_midway_never_leaves_the_old_summary_beside_new_rows(trace, whole, tmp_path, crash):
    out = tmp_path / "sweep"
    shutil.copytree(whole, out)
    old_rows = (out / "runs.csv").read_bytes()
    new = ["--limit", "20"]
    killed = run(["sim", "sweep", "--trace", str(trace), *GRID[:-4], *new, "--cost", "roofline:h200", "--jobs", "1",
                  "--out", str(out), "--overwrite"], crash)
    assert killed.returncode == -9
    assert not (out / "summary.csv").exists()
    if crash == "sweep-overwrite":  # the old sweep, less its summary: it resumes as it was
        assert (out / "runs.csv").read_bytes() == old_rows
        assert (out / "sweep.json").read_bytes() == (whole / "sweep.json").read_bytes()
        assert sweep(trace, out, "--resume").returncode == 0
        assert_same_sweep(out, whole)
    else:  # the new sweep so far: its record and its first row, nothing of the old one
        assert data_rows(out / "runs.csv") == 1 and '"limit": 20' in (out / "sweep.json").read_text()
        finished = run(["sim", "sweep", "--trace", str(trace), *GRID[:-4], *new, "--cost", "roofline:h200",
                        "--jobs", "1", "--out", str(out), "--resume"])
        assert finished.returncode == 0, finished.stderr
        assert data_rows(out / "runs.csv") == POINTS and (out / "summary.csv").exists()


def living_in_group(group: int) -> list[int]:
    """The processes of process group `group` that are not zombies, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = stat[stat.rindex(")") + 2:].split()[:3]
        if int(pgrp) == group and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_workers_of_a_killed_sweep_end_with_it(trace, tmp_path):
    env = dict(os.environ, LLMSIM_CRASH_AT="sweep-row:1")
    parent = subprocess.Popen([sys.executable, "-m", "sim", "sweep", "--trace", str(trace), *GRID, "--jobs", "2",
                               "--out", str(tmp_path / "sweep")], cwd=ROOT, env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert parent.wait(timeout=300) == -9  # killed by SIGKILL once a worker's row was written
    assert data_rows(tmp_path / "sweep" / "runs.csv") == 1
    deadline = time.monotonic() + 60
    while (left := living_in_group(parent.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:  # not to leave them behind when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not left, f"workers {left} outlived their parent"


BENCH = ["engine", "bench", "--model", "tiny", "--device", "cpu", "--new-tokens", "2", "--warmup", "0", "--runs", "2",
         "--engine", "batched", "--prompts", "p16", "--batch-size", "1"]


def csv_run_ids(store: RunStore) -> list[str]:
    with open(store.csv_path, newline="") as f:
        return [row["run_id"] for row in csv.DictReader(f)]


def test_a_bench_killed_between_a_runs_directory_and_its_row_leaves_a_readable_store(tmp_path):
    pytest.importorskip("torch")
    store = RunStore(tmp_path / "batched")
    killed = run([*BENCH, "--out", str(tmp_path)], crash="run-dir:2")
    assert killed.returncode == -9, killed.stderr
    rows = store.rows()
    assert len(rows) == 1 and csv_run_ids(store) == [rows[0]["run_id"]]
    orphans = [d.name for d in store.root.iterdir() if d.is_dir() and d.name != rows[0]["run_id"]]
    assert len(orphans) == 1 and not orphans[0].startswith(".")  # the second run's directory, without a row
    assert len(store.requests(rows[0]["run_id"])) == 1
    again = run([*BENCH, "--out", str(tmp_path)])
    assert again.returncode == 0, again.stderr
    ids = [r["run_id"] for r in store.rows()]
    assert len(ids) == 3 and csv_run_ids(store) == ids and orphans[0] not in ids
    for run_id in ids:
        assert len(store.passes(run_id)) == 2  # every row's directory is there and whole


def test_a_bench_killed_between_runs_jsonl_and_runs_csv_has_its_csv_made_whole_by_the_next_row(tmp_path):
    pytest.importorskip("torch")
    store = RunStore(tmp_path / "batched")
    assert run([*BENCH, "--out", str(tmp_path)], crash="run-row:1").returncode == -9
    first = [r["run_id"] for r in store.rows()]
    assert len(first) == 1 and not store.csv_path.exists()  # the row is in runs.jsonl, the record
    assert run([*BENCH, "--out", str(tmp_path)]).returncode == 0
    ids = [r["run_id"] for r in read_jsonl(store.rows_path)]
    assert len(ids) == 3 and ids[0] == first[0] and csv_run_ids(store) == ids


def test_a_run_directory_left_without_its_row_is_replaced_by_the_next_run_of_that_id(tmp_path):
    store = RunStore(tmp_path)
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "passes.jsonl.gz").write_bytes(b"cut")
    store.write_run("r1", [], [], {"run_id": "r1", "x": 1})
    assert store.passes("r1") == [] and [r["run_id"] for r in store.rows()] == ["r1"]
    with pytest.raises(ValueError, match="run ids must be unique"):
        store.write_run("r1", [], [], {"run_id": "r1", "x": 2})
    assert [r["x"] for r in store.rows()] == [1] and csv_run_ids(store) == ["r1"]


def test_a_run_directory_is_replaced_in_one_step_where_linux_can_swap_two(tmp_path, monkeypatch):
    from sim import output
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text("old")
    if not output._exchange(tmp_path, tmp_path):  # swapping a directory with itself: can this system swap?
        pytest.skip("no renameat2 RENAME_EXCHANGE here")
    monkeypatch.setattr(Path, "rename", lambda *a: pytest.fail("out was moved aside, leaving a moment without it"))
    with output.atomic_dir(out) as tmp:
        (tmp / "metrics.json").write_text("new")
    assert [p.name for p in tmp_path.iterdir()] == ["run"] and (out / "metrics.json").read_text() == "new"
