"""Finished requests kept as compact rows: the same records and the same metrics as the record
objects they replace, the same bytes on disk, Parquet round trips, and a footprint per replica
and per request that does not grow with what has passed."""
from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core.kv import BlockPool
from core.metrics import compute_metrics
from core.records import RequestRecord, records_to_csv, to_dict, write_jsonl
from core.request_table import RequestTable, TableBuilder
from core.scheduler import Sequence
from core.table_io import read_table, write_table_csv, write_table_jsonl, write_table_parquet
from sim import run as sim_run
from sim.__main__ import main
from sim.build import RunSpec, simulate_spec
from sim.output import read_requests

REPO = Path(__file__).resolve().parent.parent
FIXTURES = {  # the committed traces, with settings that bring rejections, preemptions and several replicas
    "poisson r8, continuous": dict(trace="traces/data/poisson_p256_r8.csv"),
    "fixed prompts, small cache": dict(trace="traces/data/fixed_prompts_r1.csv", kv_blocks=200, max_model_len=2048,
                                       rate=20.0),
    "poisson r8, swap": dict(trace="traces/data/poisson_p256_r8.csv", kv_blocks=64, max_model_len=1024,
                             preemption="swap", policy="chunked"),
    "fixed prompts, disaggregated": dict(trace="traces/data/fixed_prompts_r1.csv", disaggregate="1:2"),
    "poisson r2, static, 3 replicas": dict(trace="traces/data/poisson_p256_r2.csv", policy="static", replicas=3,
                                           router="least-kv"),
}
SLOS = [None, {"ttft": 0.05, "tpot": 0.004}, {"e2el": 2.0}]


def reference_metrics(records: list[RequestRecord], slos):
    """vLLM's definitions computed record by record (core.metrics' code before it took columns,
    with vLLM's duration: to the last response, refusals included): the oracle the table path
    must match exactly."""
    done = [r for r in records if r.completed]
    ttft = [r.ttft_s for r in done if r.first_token_s is not None]
    tpot = [r.tpot_s for r in done if r.tpot_s is not None]
    e2el = [r.e2el_s for r in done]
    keep_all = all(r.token_times_s or r.itl_count == 0 for r in done)
    itl = [g for r in done for g in r.itls_s()]
    ends = [r.finish_s for r in done] + [r.arrival_s if r.finish_s is None else r.finish_s
                                         for r in records if r.rejected is not None]
    duration = max(ends) - min(r.arrival_s for r in records) if ends else 0.0
    good = None
    if slos:
        good = sum(all(v is None or v <= slos[k] for k, v in (("ttft", r.ttft_s), ("tpot", r.tpot_s),
                                                              ("e2el", r.e2el_s)) if k in slos) for r in done)
    stats = lambda a: (len(a), float(np.mean(a)), float(np.median(a)), float(np.std(a)),  # noqa: E731
                       [float(np.percentile(a, p)) for p in (50, 90, 99)]) if a else (0,)
    itl_stats = stats(itl) if keep_all else (sum(r.itl_count for r in done),
                                            sum(r.itl_sum_s for r in done) / sum(r.itl_count for r in done))
    return dict(completed=len(done), rejected=sum(r.rejected is not None for r in records), duration=duration,
                good=good, ttft=stats(ttft), tpot=stats(tpot), e2el=stats(e2el), itl=itl_stats,
                total_in=sum(r.prompt_tokens for r in done), total_out=sum(r.output_tokens for r in done),
                preemptions=sum(r.preemptions for r in records))


def same(a, b) -> bool:
    """Two Metrics alike in every value (NaN equal to NaN)."""
    x, y = a.as_row(), b.as_row()
    return x.keys() == y.keys() and all(x[k] == y[k] or (x[k] != x[k] and y[k] != y[k]) for k in x)


def metrics_view(m, keep_all: bool):
    def stats(d):
        if d.count == 0:
            return (0,)
        return (d.count, d.mean, d.median, d.std, [d.percentiles[p] for p in (50.0, 90.0, 99.0)])
    return dict(completed=m.completed, rejected=m.rejected, duration=m.duration_s,
                good=None if m.goodput is None else 0 if math.isnan(m.goodput) else round(m.goodput * m.duration_s),
                ttft=stats(m.ttft), tpot=stats(m.tpot), e2el=stats(m.e2el),
                itl=stats(m.itl) if keep_all else (m.itl.count, m.itl.mean),
                total_in=m.total_input_tokens, total_out=m.total_output_tokens, preemptions=m.preemptions)


class KeepingBuilder(sim_run.TableBuilder):
    """The run's row builder, also keeping every sequence it was given (as the run used to)."""
    kept: list = []

    def add(self, seq) -> None:
        KeepingBuilder.kept.append(seq)
        super().add(seq)


@pytest.mark.parametrize("times", [True, False], ids=["token times", "no token times"])
@pytest.mark.parametrize("name", FIXTURES)
def test_rows_are_the_records_and_give_their_metrics(name, times, monkeypatch):
    monkeypatch.setattr(sim_run, "TableBuilder", KeepingBuilder)
    KeepingBuilder.kept = []
    result = simulate_spec(RunSpec(**FIXTURES[name], keep_token_times=times, run_id="r"))
    records = [s.record("r") for s in sorted(KeepingBuilder.kept, key=lambda s: s.index)]
    assert all(r.queued_s is not None for r in records)  # the simulator records them
    kept = records if times else without_queue_times(records)  # the table keeps them with token times
    assert result.table.records() == kept
    assert RequestTable.from_records(records).records() == records
    if name != "poisson r8, continuous":
        assert sum(r.rejected is not None for r in records) or sum(r.preemptions for r in records) or \
            len({r.replica for r in records}) > 1  # the fixtures exercise what they claim
    keep_all = times or all(r.itl_count == 0 for r in records if r.completed)
    for slos in SLOS:
        table_metrics = compute_metrics(result.table, slos)
        assert metrics_view(table_metrics, keep_all) == reference_metrics(records, slos)
        assert same(compute_metrics(kept, slos), table_metrics)


def test_a_finished_request_costs_a_row_of_under_100_bytes():
    result = simulate_spec(RunSpec(trace="traces/data/poisson_p256_r8.csv"))
    t = result.table
    nbytes = sum(getattr(t, f).nbytes for f in ("arrival_s", "prompt_tokens", "max_output_tokens", "output_tokens",
                                                "first_token_s", "finish_s", "itl_sum_s", "itl_count",
                                                "preemptions", "replica"))
    assert t.request_id is None and t.token_times_s is None and nbytes / len(t) <= 80
    assert t.queued_s is None and t.scheduled_s is None


def odd_records() -> list[RequestRecord]:
    result = simulate_spec(RunSpec(trace="traces/data/fixed_prompts_r1.csv", max_model_len=2048, keep_token_times=True))
    records = result.requests[:60]
    for i, r in enumerate(records):  # ids a CSV must quote, and text JSON must escape
        r.request_id = ["a,b", 'say "hi"', "ünïcode", " space", "line\nbreak", "plain"][i % 6] + str(i)
    assert any(r.rejected for r in records) and any(r.token_times_s for r in records)
    return records


def without_queue_times(records: list[RequestRecord]) -> list[RequestRecord]:
    return [dataclasses.replace(r, queued_s=None, scheduled_s=None) for r in records]


def record_sets():
    """Records with queued_s and scheduled_s (some rows without: a rejection is never scheduled),
    records without them, and none."""
    odd = odd_records()
    assert any(r.queued_s is not None and r.scheduled_s is None for r in odd)  # rejected: taken in, never run
    assert any(r.scheduled_s is not None for r in odd)
    plain = simulate_spec(RunSpec(trace="traces/data/poisson_p256_r8.csv")).requests
    return [odd, without_queue_times(odd), plain, []]


def test_queue_times_are_kept_where_the_records_have_them():
    odd = odd_records()
    table = RequestTable.from_records(odd)
    assert table.queued_s is not None and table.scheduled_s is not None
    assert np.isnan(table.scheduled_s).any() and not np.isnan(table.scheduled_s).all()
    assert table.records() == odd and table.records(5, 9) == odd[5:9]
    bare = RequestTable.from_records(without_queue_times(odd))
    assert bare.queued_s is None and bare.scheduled_s is None
    assert bare.records() == without_queue_times(odd)
    one = without_queue_times(odd)
    one[3] = dataclasses.replace(one[3], queued_s=1.25)  # one value is enough to keep the column
    table = RequestTable.from_records(one)
    assert table.queued_s is not None and table.scheduled_s is None and table.records() == one


def sequence(index: int, queued_s, scheduled_s, keep_token_times: bool) -> Sequence:
    s = Sequence(f"q{index}", 0.5 * index, 8, 3, keep_token_times=keep_token_times, index=index)
    s.num_tokens = 11
    s.first_token_s, s.last_token_s, s.finish_s = 1.0 + index, 1.5 + index, 1.5 + index
    if s.token_times is not None:
        s.token_times += [1.0 + index, 1.25 + index, 1.5 + index]
    s.queued_s, s.scheduled_s = queued_s, scheduled_s
    return s


@pytest.mark.parametrize("times", [True, False], ids=["token times", "no token times"])
def test_the_builder_keeps_queue_times_only_with_token_times(times):
    seqs = [sequence(0, 0.125, 0.5, times), sequence(1, 0.75, None, times), sequence(2, 1.0625, 1.5, times)]
    seqs[1].rejected, seqs[1].num_tokens, seqs[1].first_token_s = "too long", 8, None
    seqs[1].last_token_s = seqs[1].finish_s = None
    if seqs[1].token_times is not None:
        seqs[1].token_times.clear()
    builder = TableBuilder("b", keep_token_times=times, ids=True)
    for s in reversed(seqs):  # rows go by index, whatever order they finish in
        builder.add(s)
    table = builder.table()
    assert (table.queued_s is not None, table.scheduled_s is not None) == (times, times)
    expected = [s.record("b") for s in seqs]
    assert table.records() == (expected if times else without_queue_times(expected))
    assert [r.scheduled_s for r in table.records()] == ([0.5, None, 1.5] if times else [None] * 3)


def test_table_files_are_byte_for_byte_the_record_files(tmp_path):
    for records in record_sets():
        table = RequestTable.from_records(records)
        write_jsonl(records, tmp_path / "a.jsonl")
        records_to_csv(records, tmp_path / "a.csv")
        write_table_jsonl(table, tmp_path / "b.jsonl")
        write_table_csv(table, tmp_path / "b.csv")
        assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
        assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
        if records:
            assert read_table(tmp_path / "b.jsonl").records() == records
            assert read_table(tmp_path / "b.csv").records() == records


def test_parquet_round_trip(tmp_path):
    pytest.importorskip("pyarrow", reason="pyarrow is the optional [parquet] extra; not installed here")
    for records in record_sets()[:3]:
        write_table_parquet(RequestTable.from_records(records), tmp_path / "r.parquet")
        back = read_table(tmp_path / "r.parquet")
        assert back.records() == records
        assert same(compute_metrics(back), compute_metrics(records))


def test_files_written_before_queue_times_still_read(tmp_path):
    """JSONL, CSV and Parquet files without the queued_s and scheduled_s columns (as written
    before they were recorded) read back as the same records with None for both."""
    records = without_queue_times(odd_records())
    old = [{k: v for k, v in to_dict(r).items() if k not in ("queued_s", "scheduled_s")} for r in records]
    write_jsonl(old, tmp_path / "old.jsonl")
    records_to_csv(old, tmp_path / "old.csv")
    with open(tmp_path / "old.csv", newline="", encoding="utf-8") as f:
        assert next(csv.reader(f))[-1] == "run_id"
    for name in ("old.jsonl", "old.csv"):
        table = read_table(tmp_path / name)
        assert table.queued_s is None and table.records() == records
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is the optional [parquet] extra; not installed here")
    write_table_parquet(RequestTable.from_records(records), tmp_path / "new.parquet")
    columns = pq.read_table(tmp_path / "new.parquet")
    assert columns.column("queued_s").null_count == len(records)
    pq.write_table(columns.drop_columns(["queued_s", "scheduled_s"]), tmp_path / "old.parquet")
    assert "queued_s" not in pq.read_table(tmp_path / "old.parquet").column_names
    table = read_table(tmp_path / "old.parquet")
    assert table.queued_s is None and table.records() == records


def metric_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(("Successful", "Mean", "Median", "P99", "Request"))]


@pytest.mark.parametrize("fmt", ["jsonl,csv", "parquet", "csv"])
def test_run_writes_the_format_asked_and_metrics_reads_it_back(tmp_path, capsys, fmt):
    if "parquet" in fmt:
        pytest.importorskip("pyarrow", reason="pyarrow is the optional [parquet] extra; not installed here")
    out = tmp_path / "out"
    assert main(["run", "--trace", "traces/data/poisson_p256_r8.csv", "--replicas", "2", "--out", str(out),
                 "--format", fmt, "--goodput", "ttft:40"]) == 0
    printed = metric_lines(capsys.readouterr().out)
    assert sorted(p.name for p in out.glob("requests.*")) == sorted(f"requests.{f}" for f in fmt.split(","))
    assert main(["metrics", str(out), "--goodput", "ttft:40"]) == 0
    assert metric_lines(capsys.readouterr().out) == printed and len(printed) >= 8
    assert len(read_requests(out)) == 300


def test_a_bad_format_or_a_missing_pyarrow_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert main(["run", "--trace", "traces/data/poisson_p256_r8.csv", "--out", str(out), "--format", "xlsx"]) == 2
    assert "--format 'xlsx': choose one or more of jsonl, csv, parquet" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed
    assert main(["run", "--trace", "traces/data/poisson_p256_r8.csv", "--out", str(out), "--format", "parquet"]) == 2
    err = capsys.readouterr().err
    assert "--format parquet: Parquet needs pyarrow" in err and "llm-serving-sim[parquet]" in err
    assert not out.exists()


def test_ten_thousand_replicas_run_in_bounded_memory(tmp_path):
    """Each replica used to list every free KV block id (10 MB for an H200): 10,000 replicas were
    killed at 24 GB. Here the run must fit in 1.5 GB of address space."""
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20)); "
            "from sim.__main__ import main; sys.exit(main(['run', '--trace', 'traces/data/poisson_p256_r8.csv', "
            f"'--replicas', '10000', '--router', 'least-outstanding', '--out', {str(tmp_path / 'o')!r}]))")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Successful requests:                    300" in done.stdout
    assert json.loads((tmp_path / "o" / "metrics.json").read_text())["metrics"]["completed"] == 300


def test_a_pool_of_a_million_blocks_costs_nothing_until_used():
    pool = BlockPool(1_000_000, 16)
    assert pool.free_blocks == 1_000_000 and sys.getsizeof(pool.free_ids) < 1000
