"""`python -m traces`: every subcommand runs, has --help, and reports bad input in one line;
the committed traces in traces/data are exactly what traces/data/regenerate.sh writes."""
from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import pytest

from traces.__main__ import main
from traces.io import load_trace, save_trace
from traces.trace import Trace

DATA = Path(__file__).resolve().parent.parent / "traces" / "data"


@pytest.mark.parametrize("argv", [[], ["generate"], *[["generate", k] for k in
                                  ("poisson", "gamma", "fixed", "onoff", "ramp")],
                                  ["convert"], ["summary"], ["download"], ["clip"], ["scale"], ["window"]])
def test_every_subcommand_has_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv + ["--help"])
    assert exit_.value.code == 0
    assert "usage: python -m traces" in capsys.readouterr().out


@pytest.mark.parametrize("args", [
    "poisson --rate 4 --n 50 --prompt 16,64", "gamma --rate 4 --burstiness 0.5 --duration 20",
    "fixed --n 20", "onoff --rate-on 10 --on 2 --off 3 --n 40 --output 8:16",
    "ramp --rates 1,10 --duration 30", "ramp --daily 10,2 --duration 60"])
def test_generate_writes_a_loadable_trace(tmp_path, args):
    out = tmp_path / "g.csv"
    assert main(["generate", *args.split(), "--out", str(out)]) == 0
    assert len(load_trace(out)) > 0


def test_clip_scale_window_convert_and_summary_chain(tmp_path, capsys):
    src = tmp_path / "azure.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2023-11-16 18:00:00.0000000,100,50\n2023-11-16 18:00:01.0000000,300,10\n"
                   "2023-11-16 18:00:02.0000000,150,100\n2023-11-16 18:00:04.0000000,10,10\n")
    conv, clip, scaled, cut = (tmp_path / f"{n}.csv" for n in ("conv", "clip", "scaled", "cut"))
    assert main(["convert", str(src), "--fmt", "azure", "--out", str(conv)]) == 0
    assert main(["clip", str(conv), "--context", "200", "--out", str(clip)]) == 0
    assert "dropped=1, clipped=1" in capsys.readouterr().out
    assert main(["scale", str(clip), "--rate", "1.5", "--out", str(scaled)]) == 0
    assert main(["window", str(scaled), "--start", "0", "--end", "1.0", "--out", str(cut)]) == 0
    assert load_trace(scaled).rate == pytest.approx(1.5)
    assert load_trace(cut).output_tokens.tolist() == [50, 50]
    assert main(["summary", str(src)]) == 0
    assert "busiest_minute_rate" in capsys.readouterr().out


def test_bad_input_is_one_line_on_stderr_and_exit_status_two(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens\n0,1,1\n1,-1,1\n")
    assert main(["summary", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"{bad}, line 3:" in err and err.count("\n") == 1


@pytest.mark.parametrize("args, message", [
    ("summary", "the following arguments are required: input"),  # argparse's own errors: one line too
    ("generate poisson --rate 0 --n 5", "argument --rate: must be more than 0, got 0"),
    ("generate poisson --rate nan --n 5", "argument --rate: expected a finite number, got 'nan'"),
    ("generate poisson --rate 1 --n 1000000000000", "argument --n: must be at most 1e+08"),
    ("generate poisson --rate 1 --duration 1e15", "argument --duration: must be at most 1e+08"),
    ("generate poisson --rate 1 --n 5 --prompt 0", "argument --prompt: token lengths must be at least 1"),
    ("generate fixed --prompts 16,x", "argument --prompts: expected lengths like 16,64,256"),
    ("generate poisson --rate 1 --n 5 --seed -1", "argument --seed: must be at least 0"),
    ("clip {trace} --context 0", "argument --context: must be at least 2, got 0"),
    ("scale {trace} --rate inf", "argument --rate: expected a finite number, got 'inf'"),
    ("window {trace} --start nan --end 1", "argument --start: expected a finite number"),
    ("window {trace} --start 5 --end 1", "--end 1 must be after --start 5"),
    ("window {trace} --start 100 --end 101", "no request of"),
    ("summary {trace} --window 0", "argument --window: must be more than 0, got 0"),
    ("summary {trace} --window 1e-9", "--window 1e-09: the trace spans 1 s, which makes 1e+09 windows"),
    ("convert {trace} --out {tmp}", "is a directory"),
])
def test_bad_options_are_one_line_naming_the_option_and_nothing_is_written(tmp_path, capsys, args, message):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,1,1\n1,1,1\n")
    argv = args.format(trace=trace, tmp=tmp_path).split()
    if "--out" not in argv and argv[0] != "summary":
        argv += ["--out", str(tmp_path / "out.csv")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


def test_summary_of_a_long_trace_leaves_out_the_default_windows_it_would_not_print(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,1,1\n90000000,1,1\n")
    assert main(["summary", str(trace)]) == 0  # 150,000 windows of 600 s: the line is left out
    out = capsys.readouterr().out
    assert "busiest_minute_rate" in out and "window" not in out


def test_committed_traces_match_the_documented_command(tmp_path, monkeypatch):
    lines = [line for line in (DATA / "regenerate.sh").read_text().splitlines()
             if line.startswith("python -m traces ")]
    assert len(lines) >= 2
    for line in lines:
        argv = shlex.split(line)[3:]
        committed = Path(argv[argv.index("--out") + 1])
        argv[argv.index("--out") + 1] = str(tmp_path / committed.name)
        assert main(argv) == 0
        fresh = (tmp_path / committed.name).read_bytes()
        assert fresh == (DATA / committed.name).read_bytes(), (
            f"{committed} differs from what `{line}` writes now: the generator or numpy's random "
            "streams changed. Rerun traces/data/regenerate.sh and the results that use it.")
        assert len(fresh) < 50_000


def test_saved_file_is_the_documented_header_then_rows(tmp_path):
    path = save_trace(Trace(np.array([0.0, 0.5]), np.array([3, 4]), np.array([5, 6]),
                            priority=np.array([1, 0]), block_hashes=[[1, 2], []]), tmp_path / "t.csv")
    assert path.read_text() == "arrival_s,prompt_tokens,output_tokens,priority,block_hashes\n" \
                               "0.0,3,5,1,1 2\n0.5,4,6,0,\n"
