"""The open-run writer: records kept while the engine works, written while it waits, none lost."""
import gzip
import json

import pytest

from core.records import PassRecord, RequestRecord
from core.runstore import OpenRunWriter, RunStore


def a_pass(step: int) -> PassRecord:
    return PassRecord(run_id="r", engine="continuous", step=step, kind="decode", new_tokens=[1, 1],
                      context_lens=[5, 9], start_s=step * 1e-3, duration_s=1e-3)


def a_request(i: int) -> RequestRecord:
    return RequestRecord(request_id=f"q{i}", arrival_s=0.0, prompt_tokens=4, max_output_tokens=2)


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_records_are_written_only_while_the_engine_waits_and_all_at_close(tmp_path):
    writer = OpenRunWriter(RunStore(tmp_path), "run")
    for i in range(5):
        writer.pass_done(a_pass(i))
    writer.request(a_request(0))
    assert lines(writer.dir / "passes.jsonl") == []  # kept, not written: the engine never waited
    budget = iter([True, True, False])
    writer.write_while(lambda: next(budget))  # the GPU stays busy for two records
    assert [r["step"] for r in lines(writer.dir / "passes.jsonl")] == [0, 1]
    writer.write_while(lambda: False)
    assert len(lines(writer.dir / "passes.jsonl")) == 2
    writer.close()
    with gzip.open(writer.dir / "passes.jsonl.gz", "rt") as f:
        assert [json.loads(line)["step"] for line in f] == [0, 1, 2, 3, 4]
    with gzip.open(writer.dir / "requests.jsonl.gz", "rt") as f:
        assert [json.loads(line)["request_id"] for line in f] == ["q0"]


def test_an_engine_that_never_waits_has_its_records_written_past_a_bound(tmp_path):
    writer = OpenRunWriter(RunStore(tmp_path), "run", max_pending=3)
    for i in range(4):
        writer.pass_done(a_pass(i))
    assert [r["step"] for r in lines(writer.dir / "passes.jsonl")] == [0, 1, 2, 3]
    writer.request(a_request(1))
    assert lines(writer.dir / "requests.jsonl") == []


def test_an_open_run_left_without_its_row_is_replaced_by_the_next_run_of_that_id(tmp_path):
    """engine serve-trace killed mid-run leaves a directory and no row: the same run id runs again
    (as write_run lets a closed run), while a run with its row stays refused."""
    store = RunStore(tmp_path)
    (store.run_dir("open") / "requests.jsonl").parent.mkdir(parents=True)
    (store.run_dir("open") / "requests.jsonl").write_text('{"cut short')
    writer = OpenRunWriter(store, "open")
    assert not (writer.dir / "requests.jsonl").read_text().startswith('{"cut')
    writer.close()
    store.append_row({"run_id": "open", "status": "ok"})
    with pytest.raises(ValueError, match="run ids must be unique"):
        OpenRunWriter(store, "open")
