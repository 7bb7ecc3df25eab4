"""`python -m engine serve-trace`: bad input is one line naming the option, exit status 2, and
nothing is written (on the CPU, with the tiny preset)."""
import pytest
pytest.importorskip("torch", reason="the engine's tests need the engine extra (torch)")

from engine.serve import main

TRACE = "arrival_s,prompt_tokens,output_tokens\n0,16,2\n0.01,17,2\n"


@pytest.mark.parametrize("extra, message", [
    (["--block-size", "0"], "argument --block-size: must be at least 1, got 0"),
    (["--kv-blocks", "0"], "argument --kv-blocks: must be at least 1, got 0"),
    (["--kv-gib", "nan"], "argument --kv-gib: expected a finite number, got 'nan'"),
    (["--kv-gib", "1e6"], "--kv-gib / --kv-blocks: a KV cache of"),
    (["--max-model-len", "0"], "argument --max-model-len: must be at least 2, got 0"),
    (["--max-num-batched-tokens", "0"], "argument --max-num-batched-tokens: must be at least 1, got 0"),
    (["--limit", "-1"], "argument --limit: must be at least 1, got -1"),
    (["--limit", "0"], "argument --limit: must be at least 1, got 0"),
    (["--window", "nan:1"], "--window 'nan:1': expected finite seconds START < END"),
    (["--window", "100:200"], "--window '100:200': no request of"),
    (["--rate-scale", "1e-300"], "--rate-scale 1e-300: the arrivals would run to"),
    (["--seed", "99999999999999999999999"], "argument --seed: must be at most"),
    (["--name", "../../x"], "argument --name: a run name is a plain name"),
    (["--replicas", "2"], "--replicas: several replicas replay a trace in real time only"),
    (["--out", "{tmp}/t.csv"], "--out {tmp}/t.csv: exists and is not a directory"),
])
def test_bad_trace_run_options_are_named_and_nothing_is_written(tmp_path, capsys, extra, message):
    (tmp_path / "t.csv").write_text(TRACE)
    argv = ["--device", "cpu", "--model", "tiny", "--replay", "closed", "--trace", str(tmp_path / "t.csv"),
            "--out", str(tmp_path / "out")] + [x.format(tmp=tmp_path) for x in extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message.format(tmp=tmp_path) in err and len(err.strip().splitlines()) == 1, err
    assert [p.name for p in tmp_path.iterdir()] == ["t.csv"]


@pytest.mark.parametrize("extra, message", [
    (["--requests", "0"], "argument --requests: must be at least 1, got 0"),  # was silently 60
    (["--duration", "nan"], "argument --duration: expected a finite number"),
    (["--output-tokens", "0"], "argument --output-tokens: must be at least 1, got 0"),
])
def test_bad_seed_workload_options_are_named(tmp_path, capsys, extra, message):
    argv = ["--device", "cpu", "--model", "tiny", "--rates", "1", "--out", str(tmp_path / "out")] + extra
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.iterdir())
