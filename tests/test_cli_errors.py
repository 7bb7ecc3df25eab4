"""The sim command line's bad inputs, each answered with one `error:` line that names the option or
the file and what is wrong, exit status 2, nothing written; and the habits it shares with vLLM's
benchmark (its option names), valid JSON out, GPU aliases and the sub-commands' dispatch."""
from __future__ import annotations

import json
import math
import os

import pytest

from sim.__main__ import main

TRACE = "arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{i * 0.1:.1f},{20 + i},{3 + i % 2}\n" for i in range(6))
FAST = ["--cost", "constant:0.001"]


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A scratch directory as the working directory, with t.csv (a trace) and a few bad inputs."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text(TRACE)
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "foreign.jsonl").write_text('{"a": 1}\n')
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    (tmp_path / "foreign.csv").write_text("a,b\n1,2\n")
    (tmp_path / "blank.csv").write_text("")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "requests.jsonl").write_text('{"x": 1}\n')
    os.symlink("loop", tmp_path / "loop")
    os.symlink("loop-b", tmp_path / "loop-a")
    os.symlink("loop-a", tmp_path / "loop-b")
    return tmp_path


BAD = [
    (["run", "--trace", "t.csv", "--goodput", "ttft:5", "ttft:6"], ["--goodput", "ttft is given twice"]),
    (["sweep", "--trace", "t.csv", "--goodput", "e2el:5", "e2el:5"], ["--goodput", "e2el is given twice"]),
    (["run", "--trace", "t.csv", "--order", "priority"], ["--order priority", "t.csv", "no priority column"]),
    (["sweep", "--trace", "t.csv", "--order", "priority"], ["--order priority", "no priority column"]),
    (["capacity", "--trace", "t.csv", "--order", "priority", "--slo", "ttft:p99:100"],
     ["--order priority", "no priority column"]),
    (["sweep", "--trace", "t.csv", "--resume"], ["--resume", "--out"]),
    (["metrics", "empty.jsonl"], ["empty.jsonl", "no request records"]),
    (["metrics", "foreign.jsonl"], ["foreign.jsonl", "not request records", "'a'"]),
    (["metrics", "list.jsonl"], ["list.jsonl", "not request records"]),
    (["metrics", "foreign.csv"], ["foreign.csv", "no field token_times_s"]),
    (["metrics", "blank.csv"], ["blank.csv", "not request records"]),
    (["metrics", "dir"], ["requests.jsonl", "not request records", "'x'"]),
    (["run", "--trace", "t.csv", "--out", "loop"], ["--out loop", "symbolic link"]),
    (["run", "--trace", "t.csv", "--out", "loop-a/run"], ["--out loop-a/run", "loop-a", "symbolic link"]),
    (["run", "--trace", "t.csv", "--out", "x" * 300], ["--out", "300 characters"]),
    (["sweep", "--trace", "t.csv", "--out", "deep/" + "y" * 300], ["--out", "300 characters"]),
    (["run", "--trace", "t.csv", "--burstiness", "0.5"], ["--burstiness", "--request-rate"]),
    (["run", "--trace", "t.csv", "--request-rate", "5", "--burstiness", "0"], ["--burstiness", "greater than 0"]),
    (["run", "--trace", "t.csv", "--request-rate", "-1"], ["--request-rate/--rate", "greater than 0"]),
    (["run", "--trace", "t.csv", "--num-prompts", "0"], ["--num-prompts/--limit", "at least 1"]),
    (["run", "--trace", "t.csv", "--percentile-metrics", "ttft,speed"], ["--percentile-metrics", "'speed'"]),
    (["run", "--trace", "t.csv", "--gpu", "b200"], ["--gpu", "a100 (a100-80gb)", "h100 (h100-sxm)"]),
    (["run", "--trace", "t.csv", "--save-result", "--result-dir", "t.csv"], ["--result-dir", "not a directory"]),
    (["sweep", "--trace", "t.csv", "--modal"], ["--modal", "modal_app.py::sweep"]),
]


@pytest.mark.parametrize("argv, words", BAD, ids=[" ".join(a)[:60] for a, _ in BAD])
def test_bad_input_is_one_error_line_naming_it_exit_2_and_nothing_written(here, capsys, argv, words):
    before = sorted(p.name for p in here.iterdir())
    assert main([*argv, *FAST] if argv[0] != "metrics" else argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)
    assert sorted(p.name for p in here.iterdir()) == before


def test_vllm_names_and_the_old_ones_run_the_same(here, capsys):
    main(["run", "--trace", "t.csv", "--request-rate", "20", "--num-prompts", "4", *FAST, "--out", "new"])
    main(["run", "--trace", "t.csv", "--rate", "20", "--limit", "4", *FAST, "--out", "old"])
    new, old = (json.loads((here / d / "metrics.json").read_text())["metrics"] for d in ("new", "old"))
    assert new["completed"] == old["completed"] == 4
    assert new["mean_ttft_ms"] == old["mean_ttft_ms"] and new["duration_s"] == old["duration_s"]


def test_burstiness_changes_the_arrivals_and_1_is_poisson(here):
    rows = {}
    for b in ("1", "1.0", "0.2"):
        main(["run", "--trace", "t.csv", "--request-rate", "20", "--burstiness", b, *FAST, "--out", f"b{b}"])
        rows[b] = [json.loads(line)["arrival_s"] for line in (here / f"b{b}" / "requests.jsonl").read_text().splitlines()]
    main(["run", "--trace", "t.csv", "--request-rate", "20", *FAST, "--out", "poisson"])
    poisson = [json.loads(line)["arrival_s"] for line in (here / "poisson" / "requests.jsonl").read_text().splitlines()]
    assert rows["1"] == rows["1.0"] == poisson and rows["0.2"] != poisson


def test_percentile_metrics_picks_the_latencies_the_table_shows(here, capsys):
    main(["run", "--trace", "t.csv", *FAST, "--percentile-metrics", "ttft,e2el"])
    out = capsys.readouterr().out
    assert "Mean TTFT" in out and "Mean E2EL" in out and "TPOT" not in out and "ITL" not in out


def test_save_result_writes_one_json_file_into_the_result_dir(here, capsys):
    assert main(["run", "--trace", "t.csv", *FAST, "--request-rate", "5", "--save-result", "--result-dir", "res"]) == 0
    (path,) = (here / "res").iterdir()
    assert path.name.startswith("continuous-5qps-qwen2.5-1.5b-") and path.suffix == ".json"
    doc = json.loads(path.read_text())
    assert doc["request_rate"] == 5 and doc["completed"] == 6 and doc["num_prompts"] == 6


def _strict(text: str):
    def refuse(constant):
        raise AssertionError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_metrics_json_is_valid_json_with_null_for_nan(here):
    # every request rejected (longer than --max-model-len): the latencies are NaN
    assert main(["run", "--trace", "t.csv", *FAST, "--max-model-len", "4", "--out", "all-rejected"]) == 0
    doc = _strict((here / "all-rejected" / "metrics.json").read_text())
    assert doc["metrics"]["completed"] == 0 and doc["metrics"]["mean_ttft_ms"] is None


def test_nan_and_inf_become_null_and_null_reads_back_as_nan():
    from core.jsontext import dumps, nan_for_null
    text = dumps({"a": math.nan, "b": [math.inf, 1.5], "c": {"d": -math.inf}})
    assert _strict(text) == {"a": None, "b": [None, 1.5], "c": {"d": None}}
    assert math.isnan(nan_for_null(_strict(text))["a"])


@pytest.mark.parametrize("alias, preset", [("a100", "a100-80gb"), ("H100", "h100-sxm")])
def test_gpu_aliases_find_their_presets(alias, preset):
    from core.roofline import GPUS, get_gpu
    assert get_gpu(alias) is GPUS[preset]


@pytest.mark.parametrize("module", ["engine", "calibrate"])
def test_engine_and_calibrate_list_their_sub_commands_and_refuse_an_unknown_one(module, capsys):
    main_of = __import__(f"{module}.__main__", fromlist=["main"])
    with pytest.raises(SystemExit) as done:
        main_of.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in main_of.COMMANDS)
    assert main_of.main(["nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "invalid choice: 'nope'" in err and err.count("\n") == 1


def test_engine_sub_command_help_is_its_own():
    from engine.__main__ import main as engine_main
    with pytest.raises(SystemExit) as done:
        engine_main(["roofline", "--help"])
    assert done.value.code == 0
