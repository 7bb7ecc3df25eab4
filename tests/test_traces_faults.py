"""Faults a careful user found in the traces: rows left out without a word, files written that the
loader then refuses, integers past int64 as options, downloads taken unchecked, and a product
that looked beside the checkout for its data."""
from __future__ import annotations

import hashlib
import http.server
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from sim.__main__ import main as sim_main
from traces import download as dl
from traces.__main__ import main as traces_main
from traces.io import count_trace, iter_trace, load_trace

REPO = Path(__file__).resolve().parents[1]
BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


# ---------------------------------------------------------------- rows left out are named


def test_sim_run_names_the_failed_burstgpt_row_it_left_out_in_its_table_and_metrics_json(tmp_path, capsys):
    trace = write(tmp_path / "b.csv", BURSTGPT_HEADER + "5,GPT-4,10,0,10,API log\n7,GPT-4,10,3,13,API log\n")
    out = tmp_path / "run"
    assert sim_main(["run", "--trace", str(trace), "--pass-log", "off", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Successful requests:                    1" in printed
    assert "Left out by the loader:                 1 (failed: zero output tokens)" in printed
    recorded = json.loads((out / "metrics.json").read_text())["left_out"]
    assert recorded == {"failed: zero output tokens": {"count": 1, "lines": [2]}}


def test_sim_metrics_prints_the_left_out_line_again_from_the_run_directory(tmp_path, capsys):
    trace = write(tmp_path / "b.csv", BURSTGPT_HEADER + "5,GPT-4,10,0,10,API log\n7,GPT-4,10,3,13,API log\n")
    out = tmp_path / "run"
    assert sim_main(["run", "--trace", str(trace), "--pass-log", "off", "--out", str(out)]) == 0
    capsys.readouterr()
    assert sim_main(["metrics", str(out)]) == 0
    assert "Left out by the loader:                 1 (failed: zero output tokens)" in capsys.readouterr().out


def test_convert_says_how_many_rows_it_left_out_and_which(tmp_path, capsys):
    trace = write(tmp_path / "b.csv", BURSTGPT_HEADER + "5,GPT-4,10,0,10,API log\n7,GPT-4,10,3,13,API log\n")
    assert traces_main(["convert", str(trace), "--out", str(tmp_path / "c.csv")]) == 0
    assert "left out by the loader: 1 (failed: zero output tokens), line 2" in capsys.readouterr().out
    assert len(load_trace(tmp_path / "c.csv")) == 1


def test_sim_run_counts_each_kind_of_azure_row_left_out(tmp_path, capsys):
    trace = write(tmp_path / "a.csv", AZURE_HEADER + "2023-11-16 18:00:00.0000000,100,0\n"
                                                     "2023-11-16 18:00:01.0000000,0,5\n"
                                                     "2023-11-16 18:00:02.0000000,100,5\n"
                                                     "2023-11-16 18:00:03.0000000,100,0\n")
    out = tmp_path / "run"
    assert sim_main(["run", "--trace", str(trace), "--pass-log", "off", "--out", str(out)]) == 0
    assert "3 (2 zero output tokens, 1 zero prompt tokens)" in capsys.readouterr().out
    recorded = json.loads((out / "metrics.json").read_text())["left_out"]
    assert recorded["zero output tokens"]["lines"] == [2, 5]
    assert recorded["zero prompt tokens"]["lines"] == [3]


def test_a_file_with_nothing_left_out_prints_no_left_out_line_and_records_none(tmp_path, capsys):
    trace = write(tmp_path / "p.csv", "arrival_s,prompt_tokens,output_tokens\n0,10,3\n1,10,3\n")
    out = tmp_path / "run"
    assert sim_main(["run", "--trace", str(trace), "--pass-log", "off", "--out", str(out)]) == 0
    assert "Left out" not in capsys.readouterr().out
    assert json.loads((out / "metrics.json").read_text())["left_out"] == {}


def test_a_streamed_public_file_reports_the_rows_left_out_in_every_chunk_even_the_last(tmp_path):
    rows = [f"{t},GPT-4,10,{0 if t in (1, 6, 7) else 3},13,API log\n" for t in range(8)]
    trace = write(tmp_path / "b.csv", BURSTGPT_HEADER + "".join(rows))
    left_out: dict = {}
    assert count_trace(trace, left_out=left_out) == 5
    chunked: dict = {}
    assert sum(len(c) for c in iter_trace(trace, chunk_rows=2, left_out=chunked)) == 5  # the last chunk: all left out
    for found in (left_out, chunked):
        assert found["failed: zero output tokens"].tolist() == [3, 8, 9]
    assert load_trace(trace).left_out["failed: zero output tokens"].tolist() == [3, 8, 9]


def test_mooncake_rows_left_out_are_named_by_their_line_past_blank_lines(tmp_path):
    trace = write(tmp_path / "m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n\n'
                                        '{"timestamp": 1, "input_length": 5, "output_length": 0}\n')
    assert load_trace(trace).left_out == {"zero output tokens": np.array([3])}


# ---------------------------------------------------------------- no file the loader refuses


def run_traces(argv: list[str], capsys) -> tuple[int, str]:
    status = traces_main(argv)
    return status, capsys.readouterr().err


def test_scale_refuses_to_write_arrivals_past_1e8_s(tmp_path, capsys):
    out = tmp_path / "slow.csv"
    status, err = run_traces(["scale", str(REPO / "traces/data/poisson_p256_r2.csv"), "--rate", "1e-9",
                              "--out", str(out)], capsys)
    assert status == 2 and err.startswith("error: --rate 1e-09:") and "1e+08 s" in err and err.count("\n") == 1
    assert not files_under(tmp_path)


@pytest.mark.parametrize("name, text, line", [
    ("a.csv", AZURE_HEADER + "2023-11-16 18:00:00.0000000,100,5\n2027-11-16 18:00:00.0000000,100,5\n", 3),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
                '{"timestamp": 200000000000, "input_length": 5, "output_length": 1}\n', 2),
])
def test_convert_refuses_a_public_file_spanning_more_than_1e8_s(tmp_path, capsys, name, text, line):
    source = write(tmp_path / name, text)
    out = tmp_path / "out" / "converted.csv"
    status, err = run_traces(["convert", str(source), "--out", str(out)], capsys)
    assert status == 2 and err.startswith(f"error: {source}, line {line}: ") and "1e+08 s" in err and err.count("\n") == 1
    assert files_under(tmp_path) == [source]


# ---------------------------------------------------------------- integers past int64


def test_a_mooncake_length_past_int64_is_an_error_on_its_line(tmp_path, capsys):
    source = write(tmp_path / "m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
                                         '{"timestamp": 1, "input_length": 99999999999999999999, "output_length": 1}\n')
    status, err = run_traces(["convert", str(source), "--out", str(tmp_path / "c.csv")], capsys)
    assert status == 2 and err.startswith(f"error: {source}, line 2: input_length is past int64")
    assert files_under(tmp_path) == [source]


@pytest.mark.parametrize("args, option", [
    (["generate", "poisson", "--rate", "1", "--n", "3", "--prompt", "99999999999999999999"], "--prompt"),
    (["generate", "poisson", "--rate", "1", "--n", "3", "--prompt", "1:99999999999999999999"], "--prompt"),
    (["generate", "poisson", "--rate", "1", "--n", "3", "--output", "1,99999999999999999999"], "--output"),
    (["generate", "fixed", "--n", "3", "--prompts", "99999999999999999999"], "--prompts"),
    (["clip", str(REPO / "traces/data/poisson_p256_r2.csv"), "--context", "99999999999999999999"], "--context"),
])
def test_an_integer_past_int64_is_one_error_line_naming_the_option(tmp_path, capsys, args, option):
    status, err = run_traces([*args, "--out", str(tmp_path / "t.csv")], capsys)
    assert status == 2 and err.startswith(f"error: argument {option}:") and err.count("\n") == 1
    assert not files_under(tmp_path)


# ---------------------------------------------------------------- downloads are checked


class Server:
    """A local HTTP server: `bodies[path] = (body, announced length)`; a shorter body than announced
    is a connection cut short."""

    def __init__(self) -> None:
        bodies: dict[str, tuple[bytes, int]] = {}
        self.bodies = bodies

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body, length = bodies[self.path]
                self.send_response(200)
                self.send_header("Content-Length", str(length))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


GOOD = (AZURE_HEADER + "".join(f"2023-11-16 18:00:{s:02d}.0000000,{100 + s},{5 + s}\n" for s in range(40))).encode()


@pytest.fixture
def pinned(server, tmp_path, monkeypatch):
    """A known trace 'azure-conv-2023' served from `server`, pinned to GOOD; the cache in tmp_path."""
    monkeypatch.delenv(dl.TRACES_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    entry = dl.PublicTrace(server.url + "/conv.csv", "azure2023/AzureLLMInferenceTrace_conv.csv", "azure",
                           "TIMESTAMP,", len(GOOD), hashlib.sha256(GOOD).hexdigest())
    monkeypatch.setitem(dl.PUBLIC_TRACES, "azure-conv-2023", entry)
    return entry


def test_a_right_download_is_kept_in_the_user_cache(server, pinned, tmp_path, capsys):
    server.bodies["/conv.csv"] = (GOOD, len(GOOD))
    status = traces_main(["download", "azure-conv-2023"])
    target = tmp_path / "cache" / "llm-serving-sim" / "traces" / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
    assert status == 0 and capsys.readouterr().out.strip() == str(target)
    assert target.read_bytes() == GOOD and files_under(tmp_path) == [target]
    assert len(load_trace(target)) == 40


def test_a_body_cut_short_in_transfer_is_refused_and_nothing_kept(server, pinned, tmp_path, capsys):
    server.bodies["/conv.csv"] = (GOOD[:int(len(GOOD) * 0.45)], len(GOOD))
    status, err = run_traces(["download", "azure-conv-2023"], capsys)
    assert status == 2 and "cut short" in err and f"expected {len(GOOD):,} bytes" in err and err.count("\n") == 1
    assert not files_under(tmp_path)


def test_a_file_cut_to_45_percent_is_refused_by_its_size(server, pinned, tmp_path, capsys):
    cut = GOOD[:int(len(GOOD) * 0.45)]
    server.bodies["/conv.csv"] = (cut, len(cut))
    status, err = run_traces(["download", "azure-conv-2023"], capsys)
    assert status == 2 and f"expected {len(GOOD):,} bytes, got {len(cut):,}" in err and err.count("\n") == 1
    assert not files_under(tmp_path)


def test_another_file_with_the_right_header_and_size_is_refused_by_its_hash(server, pinned, tmp_path, capsys):
    other = GOOD.replace(b",105,", b",106,")
    assert len(other) == len(GOOD) and other != GOOD
    server.bodies["/conv.csv"] = (other, len(other))
    status, err = run_traces(["download", "azure-conv-2023"], capsys)
    assert status == 2 and f"expected SHA-256 {pinned.sha256}, got {hashlib.sha256(other).hexdigest()}" in err
    assert not files_under(tmp_path)


def test_an_unpinned_trace_is_kept_with_its_sha256_printed_as_unverified(server, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(dl.TRACES_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    entry = dl.PUBLIC_TRACES["azure-code-2023"]
    assert entry.sha256 is None  # not verified here: see the registry
    monkeypatch.setitem(dl.PUBLIC_TRACES, "azure-code-2023", dl.PublicTrace(server.url + "/code.csv", entry.path,
                                                                           entry.fmt, entry.first_line))
    server.bodies["/code.csv"] = (GOOD, len(GOOD))
    assert traces_main(["download", "azure-code-2023"]) == 0
    err = capsys.readouterr().err
    assert "unverified" in err and hashlib.sha256(GOOD).hexdigest() in err
    assert len(files_under(tmp_path / "cache")) == 1


def test_a_local_copy_of_the_wrong_size_is_refused_not_used(pinned, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "traces"
    (folder / "azure2023").mkdir(parents=True)
    write(folder / pinned.path, GOOD.decode()[:-10])
    monkeypatch.setenv(dl.TRACES_ENV, str(folder))
    status, err = run_traces(["summary", "azure-conv-2023"], capsys)
    assert status == 2 and f"expected {len(GOOD):,} bytes, got {len(GOOD) - 10:,}" in err


def test_a_known_trace_is_looked_up_in_llmsim_traces_before_the_cache(pinned, tmp_path, monkeypatch):
    given, cache = tmp_path / "given", tmp_path / "cache" / "llm-serving-sim" / "traces"
    for folder in (given, cache):
        (folder / "azure2023").mkdir(parents=True)
        (folder / pinned.path).write_bytes(GOOD)
    monkeypatch.setenv(dl.TRACES_ENV, str(given))
    assert dl.resolve_trace("azure-conv-2023") == given / pinned.path
    monkeypatch.delenv(dl.TRACES_ENV)
    assert dl.resolve_trace("azure-conv-2023") == cache / pinned.path


def test_the_pinned_azure_conv_2023_matches_the_real_trace():
    folder = os.environ.get(dl.TRACES_ENV)
    if not folder:
        pytest.skip(f"{dl.TRACES_ENV} is unset: set it to a folder holding azure2023/AzureLLMInferenceTrace_conv.csv")
    entry = dl.PUBLIC_TRACES["azure-conv-2023"]
    data = (Path(folder) / entry.path).read_bytes()
    assert (len(data), hashlib.sha256(data).hexdigest()) == (entry.size, entry.sha256)


# ---------------------------------------------------------------- the product's words and places


def test_the_product_never_looks_beside_the_checkout_nor_calls_the_part0_workload_the_seed(capsys):
    for path in [*(REPO / "traces").glob("*.py"), REPO / "sim" / "build.py"]:
        assert "../shared" not in path.read_text() and '"shared"' not in path.read_text(), path
    with pytest.raises(SystemExit):
        traces_main(["generate", "--help"])
    text = capsys.readouterr().out
    assert "the part0 workload" in text and "seed workload" not in text
    with pytest.raises(SystemExit):
        traces_main(["download", "--help"])
    assert "../shared" not in capsys.readouterr().out
