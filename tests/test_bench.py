"""The closed-run benchmark harness, end to end on the CPU with the tiny preset."""
import pytest
pytest.importorskip("torch", reason="the engine's tests need the engine extra (torch)")
import subprocess
import sys
import time

import torch

import engine.bench as bench
from core.metrics import compute_metrics
from core.records import read_jsonl
from core.runstore import RunStore

ARGS = ["--model", "tiny", "--device", "cpu", "--new-tokens", "4", "--warmup", "1", "--runs", "2"]


def rows(path):
    return list(read_jsonl(path))


def test_recorded_runs_become_rows_with_the_simulators_metrics_and_provenance(tmp_path, capsys):
    code = bench.main(ARGS + ["--engine", "batched", "--prompts", "p16", "--batch-size", "1,2", "--out", str(tmp_path)])
    assert code == 0
    store = RunStore(tmp_path / "batched")
    runs = store.rows()
    assert [(r["batch_size"], r["run"]) for r in runs] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for r in runs:
        assert r["status"] == "ok" and r["prompt_tokens"] == 16 and r["new_tokens"] == 4
        assert r["mean_ttft_ms"] > 0 and r["decode_tokens_per_s"] > 0 and r["completed"] == r["batch_size"]
        for key in ("gpu", "torch", "dtype", "weights", "git_commit", "time"):
            assert r[key], key
        assert r["weights"] == "random" and r["dtype"] == "float16" and r["torch"] == torch.__version__
        assert r["gpu_uuid"] is None  # a CPU run names no card
        # the row's metrics are compute_metrics over the run's own request records
        requests = store.requests(r["run_id"])
        assert len(requests) == r["batch_size"] and all(q.output_tokens == 4 for q in requests)
        again = compute_metrics(requests).as_row()
        assert all(again[k] == pytest.approx(r[k]) for k in ("mean_ttft_ms", "p99_itl_ms", "mean_tpot_ms",
                                                              "output_throughput", "duration_s"))
        assert r["decode_tokens_per_s"] == pytest.approx(r["batch_size"] * 1e3 / r["mean_itl_ms"])
        passes = store.passes(r["run_id"])
        assert len(passes) == 4 and {p.run_id for p in passes} == {r["run_id"]}  # 1 prefill + 3 decodes
        assert [p.kind for p in passes] == ["prefill", "decode", "decode", "decode"]
    csv_lines = (tmp_path / "batched" / "runs.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + 4 and csv_lines[0].startswith("engine,mode,prompt")
    out = capsys.readouterr().out
    assert "tok/s" in out and "mean / median" in out and "device: cpu" in out
    assert "GB/s" not in out and "NVIDIA" not in out  # no GPU figures for a CPU run


def test_a_cpu_run_never_writes_into_the_committed_results(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "REPO", tmp_path)
    assert bench.main(["--model", "tiny", "--device", "cpu", "--prompts", "p16", "--new-tokens", "2", "--warmup", "0",
                       "--runs", "1"]) == 0
    assert not (tmp_path / "results").exists()
    assert len(RunStore(tmp_path / "out" / "results" / "cached").rows()) == 1


@pytest.mark.parametrize("extra, message", [
    (["--engine", "speculative"], "unknown engine 'speculative'"),
    (["--prompts", "p17"], "unknown prompt 'p17'"),
    (["--engine", "batched", "--batch-size", "0"], "batch size must be >= 1"),
    (["--engine", "batched", "--batch-size", "two"], "--batch-size: 'two' is not an integer"),
    (["--engine", "cached", "--batch-size", "4"], "cached engine runs at batch size 1"),
    (["--prompts", "p4096", "--new-tokens", "5000"], "exceeds the model's context of 8192"),
    (["--device", "tpu"], "--device 'tpu'"),
    (["--gpu-spec", "foo"], "unknown GPU preset 'foo'"),
    (["--graphs", "on"], "--graphs on: CUDA graphs need a CUDA device"),
    (["--dtype", "float8"], "unknown dtype 'float8'"),
    (["--runs", "x"], "argument --runs: invalid int value"),
    (["--seed", "-1"], "argument --seed: must be at least 0"),
    (["--small-batch-max", "17"], "argument --small-batch-max: must be at most 16"),
    (["--seed", "99999999999999999999999"], "argument --seed: must be at most"),
    (["--engine", "batched", "--batch-size", "100000000000"], "--batch-size 100000000000: its KV cache and logits"),
    (["--out", "{tmp}/file"], "--out {tmp}/file: exists and is not a directory"),
    (["--out", "{tmp}/file/below"], "--out {tmp}/file/below: {tmp}/file is not a directory"),
])
def test_bad_input_is_named_and_nothing_runs(tmp_path, capsys, extra, message):
    (tmp_path / "file").write_text("")
    argv = ARGS + ["--out", str(tmp_path)] + [x.format(tmp=tmp_path) for x in extra]
    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert message.format(tmp=tmp_path) in err and len(err.strip().splitlines()) == 1
    assert [p.name for p in tmp_path.rglob("*")] == ["file"]


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


def test_an_interruption_keeps_every_run_already_written(tmp_path, monkeypatch):
    real, calls = bench.generate, []

    def generate(*a, **kw):
        calls.append(1)
        if len(calls) == 4:  # warm-up, two recorded runs, then Ctrl-C
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(bench, "generate", generate)
    with pytest.raises(KeyboardInterrupt):
        bench.main(ARGS + ["--engine", "cached", "--prompts", "p16,p64", "--runs", "5", "--out", str(tmp_path)])
    store = RunStore(tmp_path / "cached")
    assert [r["run"] for r in store.rows()] == [0, 1]
    assert len((tmp_path / "cached" / "runs.csv").read_text().splitlines()) == 3
    assert all(len(store.passes(r["run_id"])) == 4 for r in store.rows())


def test_a_killed_bench_loses_only_the_run_in_flight(tmp_path):
    """kill -9 in the middle of a run: every finished run stays readable, a row cut short is
    skipped with its name, and the next bench appends after it as if nothing happened."""
    code = ("import os, signal, engine.bench as b\n"
            "real = b.RunStore.write_run\n"
            "count = [0]\n"
            "def write_run(self, run_id, passes, requests, row):\n"
            "    count[0] += 1\n"
            "    if count[0] == 3:\n"  # the third run dies half-way through appending its row
            "        with open(self.rows_path, 'a') as f: f.write(__import__('json').dumps(row)[:40])\n"
            "        os.kill(os.getpid(), signal.SIGKILL)\n"
            "    real(self, run_id, passes, requests, row)\n"
            "b.RunStore.write_run = write_run\n"
            f"b.main({ARGS + ['--runs', '5', '--prompts', 'p16', '--out', str(tmp_path)]!r})\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert done.returncode == -9
    assert bench.main(ARGS + ["--prompts", "p64", "--out", str(tmp_path)]) == 0
    store = RunStore(tmp_path / "cached")
    with pytest.warns(UserWarning, match="runs.jsonl:3: not valid JSON"):
        kept = store.rows()
    assert [(r["prompt"], r["run"]) for r in kept] == [("p16", 0), ("p16", 1), ("p64", 0), ("p64", 1)]
    assert all(len(store.requests(r["run_id"])) == 1 for r in kept)


def test_hugging_face_baseline_runs_through_the_same_harness(tmp_path):
    pytest.importorskip("transformers")
    assert bench.main(ARGS + ["--engine", "hf", "--prompts", "p16", "--out", str(tmp_path)]) == 0
    runs = rows(tmp_path / "hf" / "runs.jsonl")
    assert len(runs) == 2 and all(r["engine"] == "hf" and r["mean_itl_ms"] > 0 for r in runs)
    assert runs[0]["mode"].startswith("static-cache generate")


def test_hugging_face_generate_gives_the_cached_engines_tokens():
    pytest.importorskip("transformers")
    from engine.engines import generate
    from engine.hf_baseline import HFBaseline
    from engine.weights import build_random

    model = build_random("tiny", dtype="float32", seed=1, std=0.3)
    prompt = [[(5 * i + 11) % 150000 for i in range(13)]]
    assert HFBaseline(model).generate(prompt, 10).tokens == generate(model, prompt, 10, engine="cached").tokens


def test_a_mix_batch_holds_the_five_prompts_in_turn():
    from engine.prompts import PROMPT_LENGTHS, batch_prompts, longest_prompt, parse_prompts
    batch = batch_prompts("mix", 7)
    assert [len(p) for p in batch] == [16, 64, 256, 1024, 4096, 16, 64]
    assert longest_prompt("mix") == 4096 and longest_prompt("p64") == PROMPT_LENGTHS["p64"]
    assert parse_prompts("p16,mix") == ["p16", "mix"]


def test_continuous_runs_record_how_long_the_gpu_idled_before_them(tmp_path):
    """A closed run's first pass waits on a GPU idle since the run before it (a rest the engine's
    host spends writing records): each recorded row says how long, from the pass logs' clocks."""
    began = time.perf_counter()
    assert bench.main(ARGS + ["--engine", "continuous", "--prompts", "p16,p64", "--out", str(tmp_path)]) == 0
    whole_s = time.perf_counter() - began
    store = RunStore(tmp_path / "continuous-closed")
    runs = store.rows()
    assert [(r["prompt"], r["run"]) for r in runs] == [("p16", 0), ("p16", 1), ("p64", 0), ("p64", 1)]
    idles = [r["idle_before_s"] for r in runs]
    # a recorded run follows a warm-up or a run: always one before it, never overlapping it, and
    # within the command's own time (not a fixed bound: a busy machine idles longer)
    assert all(0 <= idle < whole_s for idle in idles), (idles, whole_s)
