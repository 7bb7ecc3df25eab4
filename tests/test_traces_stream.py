"""Reading a trace a chunk at a time: the same trace as a whole load, the same error lines, and
the same simulated records when a run pulls the chunks as it goes."""
from __future__ import annotations

import json

import numpy as np
import pytest

from core.kv import BlockPool
from core.scheduler import ContinuousBatching
from sim.cost import ConstantCost
from sim.run import simulate
from traces.io import NeedsSorting, TraceError, count_trace, iter_trace, load_trace, save_trace
from traces.tools import shape_arrivals, shape_chunks
from traces.trace import Trace, concat

HEADER = "arrival_s,prompt_tokens,output_tokens"


def project_file(tmp_path, n=1000, bad=None, name="t.csv", ids=False):
    """n rows in time order, with all optional columns when `ids`; `bad` = (row, line text)
    replaces one data row."""
    rng = np.random.default_rng(1)
    times = np.cumsum(rng.exponential(0.01, n))
    header = HEADER + (",request_id,priority,block_hashes" if ids else "")
    rows = []
    for i, t in enumerate(times):
        row = f"{float(t)!r},{rng.integers(1, 900)},{rng.integers(1, 300)}"
        if ids:
            row += f",r{i},{i % 3},{i} {i + 1}"
        rows.append(row)
    if bad is not None:
        rows[bad[0]] = bad[1]
    path = tmp_path / name
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def same_trace(a: Trace, b: Trace) -> None:
    assert np.array_equal(a.arrival_s, b.arrival_s)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens) and np.array_equal(a.output_tokens, b.output_tokens)
    assert a.request_id == b.request_id and a.block_hashes == b.block_hashes
    assert (a.priority is None) == (b.priority is None)
    if a.priority is not None:
        assert np.array_equal(a.priority, b.priority)


@pytest.mark.parametrize("chunk_rows", [7, 100, 999, 5000])
@pytest.mark.parametrize("ids", [False, True])
def test_chunks_join_into_the_whole_trace(tmp_path, chunk_rows, ids):
    path = project_file(tmp_path, ids=ids)
    chunks = list(iter_trace(path, chunk_rows=chunk_rows))
    assert max(len(c) for c in chunks) <= chunk_rows and len(chunks) == -(-1000 // chunk_rows)
    same_trace(concat(chunks, "t"), load_trace(path))
    assert count_trace(path) == 1000


BAD_ROWS = {  # row 930 of 1000 (line 932), past several chunks of 100
    "bad cell": ((930, "1e9,5,5"), "arrival_s 1000000000.0 is past"),
    "float-written count (re-read as text)": ((930, "99.5,12.0,5"), "whole number, got '12.0'"),
    "negative count": ((930, "99.5,5,-3"), "output_tokens is negative"),
    "out of order": ((930, "0.5,5,5"), "is earlier than"),
    "too many fields": ((930, "99.5,5,5,5"), "malformed row"),
}


@pytest.mark.parametrize("case", BAD_ROWS)
def test_a_bad_row_deep_in_the_file_gets_the_same_error_line_streamed(tmp_path, case):
    bad, problem = BAD_ROWS[case]
    path = project_file(tmp_path, bad=bad)
    with pytest.raises(TraceError) as whole:
        load_trace(path)
    with pytest.raises(TraceError) as streamed:
        for _ in iter_trace(path, chunk_rows=100):
            pass
    assert str(streamed.value) == str(whole.value)
    assert whole.value.line == 932 and problem in str(whole.value)


def test_a_repeated_request_id_is_found_across_chunks(tmp_path):
    path = project_file(tmp_path, ids=True)
    path.write_text(path.read_text().replace(",r900,", ",r3,"))
    with pytest.raises(TraceError, match=r"line 902: request_id 'r3' already used on line 5"):
        list(iter_trace(path, chunk_rows=64))


def azure_file(tmp_path, swap: bool = False):
    stamps = [f"2023-11-16 18:{m:02d}:{s:02d}.{f:07d}" for m in range(3) for s in range(0, 60, 7) for f in (0, 123)]
    if swap:
        stamps[20], stamps[21] = stamps[21], stamps[20]
    rows = [f"{t},{10 + i},{(i % 5)}" for i, t in enumerate(stamps)]  # output 0 every 5th: dropped
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return path


def mooncake_file(tmp_path, swap: bool = False):
    lines = [json.dumps({"timestamp": 1000 * i + (i % 3), "input_length": 600 + i, "output_length": 1 + i % 4,
                         "hash_ids": [i % 4, 100 + i]}) for i in range(50)]
    lines.insert(10, "")  # blank lines are skipped
    if swap:
        lines[30], lines[31] = lines[31], lines[30]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("make", [azure_file, mooncake_file])
def test_public_files_in_time_order_stream_as_they_load(tmp_path, make):
    path = make(tmp_path)
    for chunk_rows in (3, 11, 1000):
        same_trace(concat(list(iter_trace(path, chunk_rows=chunk_rows)), "x"), load_trace(path))


@pytest.mark.parametrize("make, line", [(azure_file, 23), (mooncake_file, 32)])
def test_a_public_file_out_of_order_cannot_stream_and_says_where(tmp_path, make, line):
    path = make(tmp_path, swap=True)
    assert len(load_trace(path)) > 0  # a whole load sorts it
    with pytest.raises(NeedsSorting, match=rf"line {line}: earlier than the request on line {line - 1}"):
        list(iter_trace(path, chunk_rows=7))


def scheduler():
    return ContinuousBatching(BlockPool(400, 16), max_num_seqs=16, max_model_len=2048)


@pytest.mark.parametrize("shape", [dict(), dict(rate_scale=3.0), dict(limit=555), dict(rate=80.0, limit=700)])
def test_a_run_pulling_chunks_gives_the_records_of_a_run_on_the_whole_trace(tmp_path, shape):
    path = project_file(tmp_path, ids=True)
    args = dict(rate=None, rate_scale=1.0, limit=None, seed=4) | shape
    whole = simulate(shape_arrivals(load_trace(path), **args), scheduler, ConstantCost(2e-3), replicas=2,
                     keep_token_times=True)
    chunks = shape_chunks(iter_trace(path, chunk_rows=64), **args, count=1000)
    streamed = simulate(chunks, scheduler, ConstantCost(2e-3), replicas=2, keep_token_times=True)
    assert streamed.requests == whole.requests and len(whole.requests) == min(1000, shape.get("limit", 1000))
    assert streamed.num_passes == whole.num_passes


def test_a_saved_trace_streams_back(tmp_path):
    trace = load_trace(project_file(tmp_path, ids=True))
    path = save_trace(trace, tmp_path / "again.csv")
    same_trace(concat(list(iter_trace(path, chunk_rows=33)), "x"), trace)


def test_sim_run_streams_a_large_file_to_the_same_records_and_checks_it_first(tmp_path, monkeypatch, capsys):
    from sim import build
    from sim.__main__ import main
    from traces import csvfile
    path = project_file(tmp_path, ids=True)
    assert main(["run", "--trace", str(path), "--rate-scale", "2", "--out", str(tmp_path / "whole")]) == 0
    monkeypatch.setattr(build, "STREAM_ABOVE_BYTES", 0)  # every file streams
    monkeypatch.setattr(csvfile, "CHUNK_ROWS", 64)
    streamed = build.check_trace(build.RunSpec(trace=str(path)))
    assert streamed[0].stream and streamed[1] == 1000
    assert main(["run", "--trace", str(path), "--rate-scale", "2", "--out", str(tmp_path / "streamed")]) == 0
    for name in ("requests.jsonl", "requests.csv"):
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "streamed" / name).read_bytes()
    capsys.readouterr()
    bad = project_file(tmp_path, bad=(930, "99.5,5,-3"), name="bad.csv")
    assert main(["run", "--trace", str(bad), "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "line 932: output_tokens is negative" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "bad").exists()
