"""The command lines against a hostile user: random bad values for their options (zero,
negative, NaN, infinity, huge, text where a number belongs, unknown names, missing files,
directories, malformed traces and calibration files), each run in-process through its `main`.

Every one must be refused the same way: exit status 2 (argparse's SystemExit(2) counts), one
line on stderr that starts with `error:` and names the option or the file, no traceback, and
nothing written: the scratch directory holds only the inputs the example wrote. Hypothesis runs
derandomized with a bounded number of examples, so the file is deterministic and quick.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=60,
                suppress_health_check=[HealthCheck.too_slow])
WIDE = settings(FUZZ, max_examples=200)  # for the tests with a few hundred (option, value) pairs

TRACE = "arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{i * 0.1:.1f},{50 + i},{4 + i % 3}\n" for i in range(8))

# Bad values by the kind of option they are given to.
COUNT = ["0", "-1", "-1000000", "nan", "inf", "1.5", "x", "", "1e3"]          # whole numbers >= 1
POSITIVE = ["0", "-1", "-0.5", "nan", "inf", "-inf", "x", "", "1e400"]       # finite numbers > 0
TIME = ["-1", "-0.001", "nan", "inf", "x", "", "1e300", "1e400"]             # finite seconds in [0, 1e8]
BANDWIDTH = POSITIVE + ["1e-300"]                                            # GB/s, at least 1e-6
SEED = ["-1", "x", "1.5", "nan", ""]


def malformed_traces() -> dict[str, bytes]:
    """Trace files the loader must refuse, each naming the file (and line)."""
    head, rows = "arrival_s,prompt_tokens,output_tokens\n", [f"{i},{10 + i},5\n" for i in range(4)]
    def text(*lines: str) -> bytes:
        return "".join(lines).encode()
    return {
        "empty": b"",
        "header only": text(head),
        "unknown column": text("arrival_s,prompt_tokens,output_tokens,user\n0,1,1,x\n"),
        "missing column": text("arrival_s,prompt_tokens\n0,1\n"),
        "extra cell, first row": text(head, "0,10,5,7\n", *rows[1:]),
        "extra cell, later row": text(head, *rows[:2], "2,10,5,7\n"),
        "trailing comma, first row": text(head, "0,10,5,\n", *rows[1:]),
        "missing cell": text(head, *rows[:2], "2,10\n"),
        "negative time": text(head, "-1,10,5\n"),
        "time past 1e8 s": text(head, "0,10,5\n", "1e15,10,5\n"),
        "nan time": text(head, "nan,10,5\n"),
        "infinite time": text(head, "inf,10,5\n"),
        "out of order": text(head, "5,10,5\n", "4,10,5\n"),
        "zero output": text(head, "0,10,0\n"),
        "fractional length": text(head, "0,10.5,5\n"),
        "huge length": text(head, "0,99999999999999999999999,5\n"),
        "blank line inside": text(head, rows[0], "\n", rows[1]),
        "bytes that are not UTF-8": head.encode() + b"0,1\xff,5\n",
        "request id not UTF-8": b"arrival_s,prompt_tokens,output_tokens,request_id\n0,10,5,caf\xe9\n",
        "repeated request id": text("arrival_s,prompt_tokens,output_tokens,request_id\n0,1,1,a\n1,1,1,a\n"),
    }


BAD_TRACES = malformed_traces()


def run(main, argv: list[str]) -> tuple[int, str]:
    """Exit status and stderr of main(argv), argparse's SystemExit included."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


def assert_refused(main, argv: list[str], names: list[str], scratch: Path) -> None:
    """main(argv) is refused with one line naming one of `names`, and writes nothing in `scratch`."""
    before = sorted(os.listdir(scratch))
    code, err = run(main, argv)
    lines = err.strip().splitlines()
    assert code == 2, f"{argv}: exit status {code}, stderr {err!r}"
    assert "Traceback" not in err, f"{argv}: {err}"
    assert len(lines) == 1 and lines[0].startswith("error: "), f"{argv}: not one error line: {err!r}"
    assert any(name in lines[0] for name in names), f"{argv}: names none of {names}: {lines[0]!r}"
    assert sorted(os.listdir(scratch)) == before, f"{argv}: wrote {set(os.listdir(scratch)) - set(before)}"


@contextlib.contextmanager
def scratch_dir():
    with tempfile.TemporaryDirectory() as d:
        path = Path(d)
        (path / "trace.csv").write_text(TRACE)
        (path / "folder").mkdir()
        yield path


def calibration_files(scratch: Path) -> dict[str, str]:
    """Calibration files that must be refused, naming the file."""
    from test_sim_cost import calibration
    files = {}
    for label, change in {
        "nan": lambda c: c["parameters"]["decode"]["graph_s"].update({"1": float("nan")}),
        "infinity": lambda c: c["parameters"]["prefill"].update(fixed_s=float("inf")),
        "huge time": lambda c: c["parameters"]["decode1"].update(fixed_s=1e300),
        "tiny rate": lambda c: c["parameters"]["prefill"].update(weight_gbs=1e-300),
        "text for a number": lambda c: c["parameters"]["decode"]["small"].update(merge_s="fast"),
        "zero slices": lambda c: c["decode_attention"].update(small=[0, 0]),
        "negative constant": lambda c: c["constants"].update(weight_bytes=-1),
        "text free_gib": lambda c: c.update(free_gib="lots"),
        "another format": lambda c: c.update(format="llm-sim-cost/v1"),
        "missing constants": lambda c: c.pop("constants"),
    }.items():
        cal = calibration(free_gib=10)
        change(cal)
        files[label] = json.dumps(cal)
    files["not json"] = "{not json"
    files["a list"] = "[1, 2]"
    paths = {}
    for i, (label, text) in enumerate(files.items()):
        path = scratch / f"cal{i}.json"
        path.write_text(text)
        paths[label] = str(path)
    return paths


# ------------------------------------------------------------------------------------------ sim

SIM_OPTIONS = {
    "--block-size": COUNT, "--hash-block-tokens": COUNT, "--kv-blocks": COUNT + ["100"],
    "--max-num-batched-tokens": COUNT, "--max-num-seqs": COUNT, "--replicas": COUNT, "--limit": COUNT,
    "--batch-size": COUNT, "--max-model-len": COUNT + ["1", "131072"], "--replications": COUNT,
    "--overhead-ms": TIME, "--batch-timeout-s": TIME, "--kv-link-latency-ms": TIME,
    "--kv-gib": POSITIVE + ["1e-300"], "--swap-gbs": BANDWIDTH, "--kv-link-gbs": BANDWIDTH,
    "--rate": POSITIVE, "--rate-scale": POSITIVE, "--seed": SEED,
    "--cost": ["constant:nan", "constant:0", "constant:-1", "constant:1e300", "constant:x", "roofline:h900",
               "roofline:", "calibrated:tpu", "calibrated:h200@h900", "magic"],
    "--policy": ["fastest", ""], "--router": ["random", ""], "--order": ["lifo"], "--preemption": ["drop"],
    "--model": ["gpt5", ""], "--gpu": ["h900", ""], "--trace-format": ["csv"],
    "--disaggregate": ["0:1", "1:0", "x", "1:1:1", "-1:2", ":"],
    "--goodput": ["ttft:nan", "ttft:0", "tpot:-5", "ttft:inf", "foo:1", "ttft:x", "ttft"],
    "--format": ["xml", ""], "--token-times": ["sometimes"],
}


@WIDE
@given(option=st.sampled_from(sorted(SIM_OPTIONS)), data=st.data())
def test_sim_run_refuses_a_bad_option_value(option, data):
    from sim.__main__ import main
    value = data.draw(st.sampled_from(SIM_OPTIONS[option]), label="value")
    with scratch_dir() as scratch:
        argv = ["run", "--trace", str(scratch / "trace.csv"), f"{option}={value}", "--out", str(scratch / "out")]
        assert_refused(main, argv, [option], scratch)


@FUZZ
@given(case=st.sampled_from(sorted(BAD_TRACES)), policy=st.sampled_from(["continuous", "chunked", "static"]))
def test_sim_run_refuses_a_malformed_trace_naming_the_file(case, policy):
    from sim.__main__ import main
    with scratch_dir() as scratch:
        path = scratch / "bad.csv"
        path.write_bytes(BAD_TRACES[case])
        argv = ["run", "--trace", str(path), "--policy", policy, "--out", str(scratch / "out")]
        assert_refused(main, argv, [str(path)], scratch)


@FUZZ
@given(which=st.sampled_from(["missing", "folder", "calibration"]), data=st.data())
def test_sim_run_refuses_a_missing_or_bad_file(which, data):
    from sim.__main__ import main
    with scratch_dir() as scratch:
        if which == "calibration":
            files = calibration_files(scratch)
            path = files[data.draw(st.sampled_from(sorted(files)), label="calibration")]
            argv = ["run", "--trace", str(scratch / "trace.csv"), "--cost", path]
        else:
            path = str(scratch / ("nope.csv" if which == "missing" else "folder"))
            option = data.draw(st.sampled_from(["--trace", "--cost", "--out"]), label="option")
            argv = ["run", "--trace", str(scratch / "trace.csv"), option, path]
            if option == "--out":  # an --out that is a file, or under one
                path = str(scratch / "trace.csv") + data.draw(st.sampled_from(["", "/below"]), label="out")
                argv[-1] = path
        assert_refused(main, argv + ([] if "--out" in argv else ["--out", str(scratch / "out")]),
                       [path], scratch)


SWEEP_LISTS = {
    "--replicas": ["1,0", "2,-1", "1,x", ",", "1,,2"], "--rate": ["5,nan", "0,5", "5,-1", "inf", "x,1"],
    "--rate-scale": ["1,0", "nan", "1,-2"], "--policy": ["continuous,foo", "continuous,"],
    "--max-num-seqs": ["0", "256,0", "x"], "--jobs": ["0", "-1", "x", "1.5"], "--replications": ["0", "-1", "x"],
    "--block-size": ["0", "nan"], "--limit": ["-1", "0"], "--kv-blocks": ["0", "100"],
}


@FUZZ
@given(option=st.sampled_from(sorted(SWEEP_LISTS)), data=st.data())
def test_sim_sweep_refuses_a_bad_value_anywhere_in_a_list(option, data):
    from sim.__main__ import main
    value = data.draw(st.sampled_from(SWEEP_LISTS[option]), label="value")
    with scratch_dir() as scratch:
        argv = ["sweep", "--trace", str(scratch / "trace.csv"), f"{option}={value}", "--jobs=1",
                "--out", str(scratch / "out")]
        if option == "--jobs":
            argv.remove("--jobs=1")
        assert_refused(main, argv, [option], scratch)


# --------------------------------------------------------------------------------------- traces

TRACES_OPTIONS = [
    ("generate poisson --n 5 --rate={}", ["0", "-1", "nan", "x", ""], "--rate"),
    ("generate poisson --rate 1 --n={}", COUNT + ["1000000000000"], "--n"),
    ("generate poisson --rate 1 --duration={}", TIME + ["0"], "--duration"),
    ("generate poisson --rate 1 --n 5 --prompt={}", ["0", "-1", "5:1", "a,b", "0:10", "x", ""], "--prompt"),
    ("generate poisson --rate 1 --n 5 --output={}", ["0", "-3", "1:0", "1.5"], "--output"),
    ("generate poisson --rate 1 --n 5 --seed={}", SEED, "--seed"),
    ("generate gamma --rate 1 --n 5 --burstiness={}", POSITIVE, "--burstiness"),
    ("generate fixed --prompts={}", ["16,x", "0", "-16", ""], "--prompts"),
    ("generate onoff --rate-on 1 --off 1 --n 5 --on={}", TIME + ["0"], "--on"),
    ("generate onoff --rate-on 1 --on 1 --n 5 --rate-off={}", ["-1", "nan", "inf", "x"], "--rate-off"),
    ("generate ramp --duration 10 --rates={}", ["1", "-1,2", "nan,1", "x", "1,inf", "0,0"], "--rates"),
    ("generate ramp --duration 10 --daily={}", ["10", "10,2,5", "-1,2", "0,0", "x"], "--daily"),
    ("generate ramp --rates 1,2 --duration={}", TIME + ["0"], "--duration"),
    ("clip {trace} --context={}", ["0", "1", "-5", "x", "nan"], "--context"),
    ("scale {trace} --rate={}", POSITIVE, "--rate"),
    ("window {trace} --end 1 --start={}", ["nan", "inf", "x", "", "5"], "--start"),
    ("summary {trace} --window={}", POSITIVE + ["1e-9"], "--window"),
    ("summary {trace} --fmt={}", ["csv", "azure", "mooncake"], "--fmt"),
    ("convert {trace} --fmt={}", ["csv", "burstgpt"], "--fmt"),
]


@WIDE
@given(case=st.sampled_from(range(len(TRACES_OPTIONS))), data=st.data())
def test_traces_refuses_a_bad_option_value(case, data):
    from traces.__main__ import main
    template, values, option = TRACES_OPTIONS[case]
    value = data.draw(st.sampled_from(values), label="value")
    with scratch_dir() as scratch:
        trace = str(scratch / "trace.csv")
        argv = template.replace("{trace}", trace).replace("{}", "\0").split()
        argv = [a.replace("\0", value) for a in argv]
        if argv[0] != "summary":
            argv += ["--out", str(scratch / "out.csv")]
        # a format that does not fit the file is named by the file; the rest by the option
        assert_refused(main, argv, [option, trace], scratch)


@WIDE
@given(case=st.sampled_from(sorted(BAD_TRACES) + ["missing", "folder"]),
       command=st.sampled_from(["summary", "convert", "clip --context 100", "scale --rate 2",
                                "window --start 0 --end 2"]))
def test_traces_refuses_a_malformed_or_missing_trace_naming_the_file(case, command):
    from traces.__main__ import main
    with scratch_dir() as scratch:
        path = scratch / ("folder" if case == "folder" else "bad.csv")
        if case not in ("missing", "folder"):
            path.write_bytes(BAD_TRACES[case])
        name, *rest = command.split()
        argv = [name, str(path), *rest] + ([] if name == "summary" else ["--out", str(scratch / "out.csv")])
        assert_refused(main, argv, [str(path)], scratch)


@FUZZ
@given(command=st.sampled_from(["convert {trace}", "clip {trace} --context 100", "generate poisson --rate 1 --n 3"]),
       out=st.sampled_from(["folder", "trace.csv/below"]))
def test_traces_refuses_an_out_that_cannot_be_a_file(command, out):
    from traces.__main__ import main
    with scratch_dir() as scratch:
        argv = command.replace("{trace}", str(scratch / "trace.csv")).split() + ["--out", str(scratch / out)]
        assert_refused(main, argv, ["--out"], scratch)


# --------------------------------------------------------------------------------------- engine

BENCH_OPTIONS = {
    "--new-tokens": COUNT + ["100000"], "--warmup": ["-1", "x", "nan"], "--runs": COUNT,
    "--batch-size": ["0", "-1", "x", ",", "1,0", "100000000000"], "--prompts": ["p17", "", "x", "p16,p9"],
    "--engine": ["speculative", ""], "--device": ["tpu", "cuda:x", "cuda"], "--gpu-spec": ["foo", ""],
    "--graphs": ["on", "maybe"], "--dtype": ["float8", ""], "--seed": SEED + ["99999999999999999999999"],
    "--model": ["gpt5", "no/such/dir"],
}


@FUZZ
@given(option=st.sampled_from(sorted(BENCH_OPTIONS)), data=st.data())
def test_engine_bench_refuses_a_bad_option_value(option, data):
    pytest.importorskip("torch", reason="the engine's tests need the engine extra (torch)")
    from engine.bench import main
    value = data.draw(st.sampled_from(BENCH_OPTIONS[option]), label="value")
    with scratch_dir() as scratch:
        argv = ["--model", "tiny", "--device", "cpu", "--new-tokens", "2", "--warmup", "0", "--runs", "1",
                "--prompts", "p16", "--engine", "batched" if option == "--batch-size" else "cached",
                f"{option}={value}", "--out", str(scratch / "out")]
        assert_refused(main, argv, [option], scratch)


def bad_checkpoints(scratch: Path) -> dict[str, Path]:
    """Checkpoint directories that must be refused, naming the directory or its file."""
    import torch
    from safetensors.torch import save_file

    from core.config import get_preset
    config = get_preset("tiny").to_hf_dict()
    shapes = {"model.embed_tokens.weight": (151936, 64), "model.norm.weight": (64,)}
    def make(name: str, config_text: str | None, weights: bytes | dict | None) -> Path:
        path = scratch / name
        path.mkdir()
        if config_text is not None:
            (path / "config.json").write_text(config_text)
        if isinstance(weights, dict):
            save_file({k: torch.zeros(s) for k, s in weights.items()}, str(path / "model.safetensors"))
        elif weights is not None:
            (path / "model.safetensors").write_bytes(weights)
        return path
    good = json.dumps(config)
    return {
        "empty directory": make("empty", None, None),
        "no weights": make("noweights", good, None),
        "empty safetensors": make("emptyst", good, b""),
        "corrupt safetensors": make("corrupt", good, b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage" * 10),
        "missing tensors": make("missing", good, shapes),
        "mis-shaped tensors": make("misshaped", good, {**shapes, "model.norm.weight": (3,)}),
        "config not json": make("badjson", "{not json", shapes),
        "config a list": make("cfglist", "[1]", shapes),
        "not qwen2": make("llama", json.dumps({**config, "model_type": "llama"}), shapes),
        "zero layers": make("zero", json.dumps({**config, "num_hidden_layers": 0}), shapes),
        "bad index": make("badindex", good, None),
    }


@FUZZ
@given(data=st.data())
def test_engine_bench_refuses_a_bad_checkpoint_naming_it(data):
    pytest.importorskip("torch", reason="the engine's tests need the engine extra (torch)")
    from engine.bench import main
    with scratch_dir() as scratch:
        checkpoints = bad_checkpoints(scratch)
        (checkpoints["bad index"] / "model.safetensors.index.json").write_text('{"weight_map": {"x": "nope"}}')
        path = checkpoints[data.draw(st.sampled_from(sorted(checkpoints)), label="checkpoint")]
        argv = ["--model", str(path), "--device", "cpu", "--new-tokens", "2", "--warmup", "0", "--runs", "1",
                "--prompts", "p16", "--out", str(scratch / "out")]
        assert_refused(main, argv, [str(path)], scratch)


SERVE_OPTIONS = {
    "--block-size": COUNT, "--kv-blocks": COUNT, "--kv-gib": POSITIVE + ["1e6"], "--max-model-len": COUNT + ["1"],
    "--max-num-batched-tokens": COUNT, "--max-num-seqs": COUNT, "--limit": COUNT, "--replicas": COUNT,
    "--batch-size": COUNT, "--batch-timeout-s": TIME, "--seed": SEED, "--rate-scale": ["0", "-1", "nan", "x", "1e-300"],
    "--window": ["a:b", "nan:1", "5:1", "100:200", "1"], "--goodput": ["ttft:nan", "ttft:0", "foo:1"],
    "--name": ["../x", "a/b", ""], "--policy": ["fastest"], "--router": ["random"], "--dtype": ["float8"],
}


@WIDE
@given(option=st.sampled_from(sorted(SERVE_OPTIONS)), data=st.data())
def test_engine_serve_trace_refuses_a_bad_option_value(option, data):
    pytest.importorskip("torch", reason="the engine's tests need the engine extra (torch)")
    from engine.serve import main
    value = data.draw(st.sampled_from(SERVE_OPTIONS[option]), label="value")
    with scratch_dir() as scratch:
        argv = ["--device", "cpu", "--model", "tiny", "--replay", "closed", "--trace", str(scratch / "trace.csv"),
                f"{option}={value}", "--out", str(scratch / "out")]
        assert_refused(main, argv, [option], scratch)
