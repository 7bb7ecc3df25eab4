"""The project CSV format: round trips, format detection, and every kind of bad input."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traces import csvfile
from traces.io import TraceError, detect_format, load_trace, save_trace
from traces.trace import Trace


def write(tmp_path, text: str, name: str = "t.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_project_file_loads_with_optional_columns(tmp_path):
    path = write(tmp_path, "arrival_s,prompt_tokens,output_tokens,request_id,priority,block_hashes\n"
                           "0,16,4,a,1,1 2 3\n0.5,32,8,b,-2,\n2.25,64,1,c,0,7\n")
    trace = load_trace(path)
    assert trace.arrival_s.tolist() == [0.0, 0.5, 2.25]
    assert trace.prompt_tokens.tolist() == [16, 32, 64]
    assert trace.output_tokens.tolist() == [4, 8, 1]
    assert trace.request_id == ["a", "b", "c"]
    assert trace.priority.tolist() == [1, -2, 0]
    assert trace.block_hashes == [[1, 2, 3], [], [7]]
    assert trace.name == "t"


def test_optional_columns_may_come_in_any_order_and_crlf_is_fine(tmp_path):
    path = write(tmp_path, "arrival_s,prompt_tokens,output_tokens,priority,request_id\r\n1,2,3,4,x\r\n")
    trace = load_trace(path)
    assert trace.priority.tolist() == [4] and trace.request_id == ["x"]
    assert trace.block_hashes is None


def test_trailing_blank_lines_are_tolerated(tmp_path):
    trace = load_trace(write(tmp_path, "arrival_s,prompt_tokens,output_tokens\n0,1,1\n1,1,1\n\n\n"))
    assert len(trace) == 2


def test_format_is_detected_from_header_or_extension(tmp_path):
    assert detect_format(write(tmp_path, "arrival_s,prompt_tokens,output_tokens\n0,1,1\n")) == "project"
    assert detect_format(write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n", "a.csv")) == "azure"
    assert detect_format(write(tmp_path, "Timestamp,Model,Request tokens,Response tokens,"
                                         "Total tokens,Log Type\n", "b.csv")) == "burstgpt"
    assert detect_format(write(tmp_path, "", "c.jsonl")) == "mooncake"
    assert detect_format(write(tmp_path, '{"timestamp": 0}\n', "d.txt")) == "mooncake"


def test_undetectable_format_says_so_and_asks_for_fmt(tmp_path):
    path = write(tmp_path, "time,in,out\n0,1,1\n")
    with pytest.raises(TraceError, match=r"line 1: cannot tell the trace format.*pass the format"):
        load_trace(path)


HEADER = "arrival_s,prompt_tokens,output_tokens\n"
BAD_PROJECT_FILES = {
    "empty file": ("", 1, "empty"),
    "blank header": ("\n0,1,1\n", 1, "blank"),
    "header only": (HEADER, 2, "no requests"),
    "missing column": ("arrival_s,prompt_tokens\n0,1\n", 1, "missing column 'output_tokens'"),
    "unknown column": ("arrival_s,prompt_tokens,output_tokens,user\n0,1,1,x\n", 1, "unknown column 'user'"),
    "repeated column": ("arrival_s,prompt_tokens,output_tokens,arrival_s\n0,1,1,0\n", 1, "more than once"),
    "unparsable time": (HEADER + "0,1,1\nsoon,1,1\n", 3, "arrival_s must be a finite number"),
    "infinite time": (HEADER + "inf,1,1\n", 2, "finite"),
    "boolean time": (HEADER + "True,1,1\nFalse,1,1\n", 2, "arrival_s must be a finite number"),
    "huge length": (HEADER + "0,99999999999999999999999,1\n", 2, "prompt_tokens must be a whole number"),
    "negative time": (HEADER + "-1,1,1\n", 2, "arrival_s is negative"),
    "negative length": (HEADER + "0,1,1\n1,-5,1\n", 3, "prompt_tokens is negative"),
    "zero output": (HEADER + "0,1,0\n", 2, "output_tokens must be at least 1"),
    "fractional length": (HEADER + "0,1,1\n1,12.5,1\n", 3, "prompt_tokens must be a whole number, got '12.5'"),
    "float-written length": (HEADER + "0,12.0,1\n", 2, "whole number, got '12.0'"),
    "text length": (HEADER + "0,1,1\n1,1,many\n", 3, "output_tokens must be a whole number"),
    "missing value": (HEADER + "0,1,1\n1,1\n", 3, "missing output_tokens"),
    "too many fields": (HEADER + "0,1,1\n1,1,1,1\n", 3, "malformed row"),
    "too many fields on the first row": (HEADER + "0,1,1,1\n1,1,1\n", 2, "malformed row"),
    "trailing comma on the first row": (HEADER + "0,1,1,\n1,1,1\n", 2, "malformed row"),
    "blank line inside": (HEADER + "0,1,1\n\n1,1,1\n", 3, "blank line"),
    "out of order": (HEADER + "0,1,1\n5,1,1\n4,1,1\n", 4, "earlier than 5.0 on line 3"),
    "repeated request id": ("arrival_s,prompt_tokens,output_tokens,request_id\n0,1,1,a\n1,1,1,b\n2,1,1,a\n",
                            4, "already used on line 2"),
    "empty request id": ("arrival_s,prompt_tokens,output_tokens,request_id\n0,1,1, \n", 2, "missing request_id"),
    "bad priority": ("arrival_s,prompt_tokens,output_tokens,priority\n0,1,1,high\n", 2, "priority must be"),
    "bad block hashes": ("arrival_s,prompt_tokens,output_tokens,block_hashes\n0,1,1,1 2\n0,1,1,3;4\n",
                         3, "block_hashes must be whole numbers"),
}


@pytest.mark.parametrize("case", BAD_PROJECT_FILES)
def test_bad_project_file_raises_error_naming_file_and_line(tmp_path, case):
    text, line, problem = BAD_PROJECT_FILES[case]
    path = write(tmp_path, text)
    with pytest.raises(TraceError) as err:
        load_trace(path, fmt="project")
    assert str(path) in str(err.value)
    assert f"line {line}:" in str(err.value)
    assert problem in str(err.value)
    assert err.value.line == line


def test_errors_after_the_first_chunk_are_still_caught_with_their_line(tmp_path, monkeypatch):
    """Validation covers every row, not just a first chunk: nothing is half-loaded."""
    monkeypatch.setattr(csvfile, "CHUNK_ROWS", 2)
    good = "".join(f"{i},1,1\n" for i in range(7))
    with pytest.raises(TraceError, match=r"line 9: output_tokens is negative"):
        load_trace(write(tmp_path, HEADER + good + "7,1,-1\n"))
    with pytest.raises(TraceError, match=r"line 5: arrival_s 1.5 is earlier"):  # across a chunk edge
        load_trace(write(tmp_path, HEADER + "0,1,1\n1,1,1\n2,1,1\n1.5,1,1\n"))
    with pytest.raises(TraceError, match=r"line 4: blank line"):  # blank line at the end of a chunk
        load_trace(write(tmp_path, HEADER + "0,1,1\n1,1,1\n\n3,1,1\n"))
    assert len(load_trace(write(tmp_path, HEADER + good + "\n\n\n"))) == 7


def test_bytes_that_are_not_text_fail_as_a_bad_cell_with_its_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(HEADER.encode() + b"0,1,1\n1,\xff\xfe,1\n")
    with pytest.raises(TraceError, match=r"line 3: prompt_tokens must be a whole number"):
        load_trace(path)


def test_a_request_id_with_bytes_that_are_not_utf8_is_refused_with_its_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"arrival_s,prompt_tokens,output_tokens,request_id\n0,1,1,ok\n1,1,1,caf\xe9\n")
    with pytest.raises(TraceError, match=r"line 3: request_id 'caf\ufffd' holds bytes that are not UTF-8"):
        load_trace(path)


def test_an_extra_cell_in_a_public_file_is_refused_too(tmp_path):
    path = write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.0000000,100,50,7\n")
    with pytest.raises(TraceError, match="line 2: malformed row: Expected 3 fields in line 2, saw 4"):
        load_trace(path)


def test_missing_file_is_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such trace file"):
        load_trace(tmp_path / "nope.csv")


def test_save_refuses_a_trace_the_loader_would_refuse(tmp_path):
    with pytest.raises(ValueError, match="non-decreasing"):
        save_trace(Trace(np.array([1.0, 0.0]), np.array([1, 1]), np.array([1, 1])), tmp_path / "x.csv")
    with pytest.raises(ValueError, match="at least 1"):
        save_trace(Trace(np.array([0.0]), np.array([0]), np.array([1])), tmp_path / "x.csv")
    assert not (tmp_path / "x.csv").exists()


traces = st.integers(min_value=1, max_value=30).flatmap(lambda n: st.builds(
    lambda gaps, prompts, outputs, prio, hashes, with_opt: Trace(
        arrival_s=np.cumsum(gaps), prompt_tokens=prompts, output_tokens=outputs,
        request_id=[f"r{i},\"x\"" for i in range(n)] if with_opt else None,
        priority=prio if with_opt else None, block_hashes=hashes if with_opt else None),
    st.lists(st.floats(0, 1e6, allow_nan=False), min_size=n, max_size=n),
    st.lists(st.integers(1, 10**9), min_size=n, max_size=n),
    st.lists(st.integers(1, 10**9), min_size=n, max_size=n),
    st.lists(st.integers(-5, 5), min_size=n, max_size=n),
    st.lists(st.lists(st.integers(-2**63, 2**63 - 1), max_size=4), min_size=n, max_size=n),
    st.booleans()))


@settings(max_examples=40, deadline=None)
@given(trace=traces)
def test_save_then_load_gives_back_the_same_trace(tmp_path_factory, trace):
    path = tmp_path_factory.mktemp("rt") / "t.csv"
    back = load_trace(save_trace(trace, path))
    assert back.arrival_s.tobytes() == trace.arrival_s.tobytes()  # bit-exact times
    assert back.prompt_tokens.tolist() == trace.prompt_tokens.tolist()
    assert back.output_tokens.tolist() == trace.output_tokens.tolist()
    assert back.request_id == trace.request_id
    assert (back.priority is None) == (trace.priority is None)
    if trace.priority is not None:
        assert back.priority.tolist() == trace.priority.tolist()
    assert back.block_hashes == trace.block_hashes
