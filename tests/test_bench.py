"""The closed-run benchmark harness, end to end on the CPU with the tiny preset."""
import json

import pytest
import torch

import engine.bench as bench
from sim.records import read_jsonl

ARGS = ["--model", "tiny", "--device", "cpu", "--new-tokens", "4", "--warmup", "1", "--runs", "2"]


def rows(path):
    return list(read_jsonl(path))


def test_recorded_runs_become_rows_with_metrics_and_provenance(tmp_path, capsys):
    code = bench.main(ARGS + ["--engine", "batched", "--prompts", "p16", "--batch-size", "1,2", "--out", str(tmp_path)])
    assert code == 0
    runs = rows(tmp_path / "batched" / "runs.jsonl")
    assert [(r["batch_size"], r["run"]) for r in runs] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for r in runs:
        assert r["status"] == "ok" and r["prompt_tokens"] == 16 and r["new_tokens"] == 4
        assert r["ttft_ms"] > 0 and len(r["itl_ms"]) == 3 and r["decode_tok_s"] > 0
        assert r["itl_mean_ms"] == pytest.approx(sum(r["itl_ms"]) / 3)
        for key in ("gpu", "torch", "dtype", "weights", "git_commit", "time"):
            assert r[key], key
        assert r["weights"] == "random" and r["dtype"] == "float16" and r["torch"] == torch.__version__
    csv_lines = (tmp_path / "batched" / "runs.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + 4 and csv_lines[0].startswith("engine,mode,prompt")
    passes = rows(tmp_path / "batched" / "passes.jsonl.gz")
    assert len(passes) == 4 * 4  # 4 recorded runs x (1 prefill + 3 decodes)
    assert {p["run_id"] for p in passes} == {r["run_id"] for r in runs}
    out = capsys.readouterr().out
    assert "tok/s" in out and "GB/s" in out and "Batch 1 ceiling" in out


@pytest.mark.parametrize("extra, message", [
    (["--engine", "speculative"], "unknown engine 'speculative'"),
    (["--prompts", "p17"], "unknown prompt 'p17'"),
    (["--engine", "batched", "--batch-size", "0"], "batch size must be >= 1"),
    (["--engine", "batched", "--batch-size", "two"], "batch size 'two' is not an integer"),
    (["--engine", "cached", "--batch-size", "4"], "cached engine runs at batch size 1"),
    (["--prompts", "p4096", "--new-tokens", "5000"], "exceeds the model's context of 8192"),
])
def test_bad_input_is_named_and_nothing_runs(tmp_path, capsys, extra, message):
    argv = ARGS + ["--out", str(tmp_path)] + extra
    assert bench.main(argv) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.rglob("runs.jsonl"))


def test_out_of_memory_is_recorded_and_the_next_configuration_runs(tmp_path, monkeypatch):
    real = bench.generate

    def generate(model, prompts, *a, **kw):
        if len(prompts) == 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return real(model, prompts, *a, **kw)

    monkeypatch.setattr(bench, "generate", generate)
    assert bench.main(ARGS + ["--engine", "batched", "--prompts", "p16", "--batch-size", "2,4,1",
                              "--out", str(tmp_path)]) == 0
    runs = rows(tmp_path / "batched" / "runs.jsonl")
    assert [(r["batch_size"], r["status"]) for r in runs] == [(2, "ok"), (2, "ok"), (4, "oom"), (1, "ok"), (1, "ok")]
    assert "out of memory at batch 4" in runs[2]["error"]


def test_an_interruption_keeps_every_row_already_written(tmp_path, monkeypatch):
    real, calls = bench.generate, []

    def generate(*a, **kw):
        calls.append(1)
        if len(calls) == 4:  # warm-up, two recorded runs, then Ctrl-C
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(bench, "generate", generate)
    with pytest.raises(KeyboardInterrupt):
        bench.main(ARGS + ["--engine", "cached", "--prompts", "p16,p64", "--runs", "5", "--out", str(tmp_path)])
    lines = (tmp_path / "cached" / "runs.jsonl").read_text().splitlines()
    assert [json.loads(l)["run"] for l in lines] == [0, 1]
    assert len((tmp_path / "cached" / "runs.csv").read_text().splitlines()) == 3


def test_hugging_face_baseline_runs_through_the_same_harness(tmp_path):
    pytest.importorskip("transformers")
    assert bench.main(ARGS + ["--engine", "hf", "--prompts", "p16", "--out", str(tmp_path)]) == 0
    runs = rows(tmp_path / "hf" / "runs.jsonl")
    assert len(runs) == 2 and all(r["engine"] == "hf" and len(r["itl_ms"]) == 3 for r in runs)
    assert runs[0]["mode"].startswith("static-cache generate")


def test_hugging_face_generate_gives_the_cached_engines_tokens():
    pytest.importorskip("transformers")
    from engine.engines import generate
    from engine.hf_baseline import HFBaseline
    from engine.weights import build_random

    model = build_random("tiny", dtype="float32", seed=1, std=0.3)
    prompt = [[(5 * i + 11) % 150000 for i in range(13)]]
    assert HFBaseline(model).generate(prompt, 10).tokens == generate(model, prompt, 10, engine="cached").tokens
