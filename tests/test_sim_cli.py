"""`python -m sim run` and `python -m sim sweep`: tables, files, and clear errors."""
import json
import subprocess
import sys

import pytest

from sim.__main__ import REPO, main

from core.records import read_pass_records, read_request_records


@pytest.fixture
def trace_csv(tmp_path):
    path = tmp_path / "trace.csv"
    rows = ["arrival_s,prompt_tokens,output_tokens"] + [f"{i * 0.05:.3f},{100 + 37 * i % 900},{5 + 13 * i % 120}"
                                                         for i in range(200)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_run_prints_the_table_and_writes_records(trace_csv, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--trace", str(trace_csv), "--policy", "chunked", "--cost", "roofline:h200",
                 "--replicas", "2", "--router", "least-outstanding", "--goodput", "ttft:50", "tpot:5",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Successful requests:                    200" in text and "Request goodput (req/s):" in text
    requests = read_request_records(out / "requests.jsonl")
    assert len(requests) == 200 and {r.replica for r in requests} == {0, 1}
    assert all(len(r.token_times_s) == r.output_tokens for r in requests)  # small trace: times kept
    passes = read_pass_records(out / "passes.jsonl")
    assert sum(p.num_tokens for p in passes) == sum(r.prompt_tokens + r.output_tokens - 1 for r in requests)
    assert (out / "requests.csv").read_text().startswith("request_id,arrival_s,")
    assert json.loads((out / "metrics.json").read_text())["metrics"]["completed"] == 200


def test_run_with_every_extra_policy(trace_csv, capsys):
    for extra in (["--policy", "decode-priority"], ["--policy", "static", "--batch-size", "4"],
                  ["--order", "spf"], ["--disaggregate", "1:2"], ["--preemption", "swap", "--kv-blocks", "2048",
                                                                   "--max-model-len", "2048"]):
        assert main(["run", "--trace", str(trace_csv), "--pass-log", "off", *extra]) == 0, extra
        assert "Successful requests:                    200" in capsys.readouterr().out


def test_replications_report_confidence_intervals(trace_csv, capsys):
    assert main(["run", "--trace", str(trace_csv), "--rate", "15", "--replications", "3", "--pass-log", "off"]) == 0
    text = capsys.readouterr().out
    assert "3 replications, mean +- 95% CI" in text and "mean_ttft_ms" in text


def test_run_with_a_calibration_file(trace_csv, tmp_path, capsys):
    cal = tmp_path / "h200.json"
    from test_sim_cost import calibration
    cal.write_text(json.dumps(calibration(free_gib=10)))
    assert main(["run", "--trace", str(trace_csv), "--cost", str(cal)]) == 0
    assert main(["run", "--trace", str(trace_csv), "--cost", str(cal), "--model", "tiny"]) == 2
    assert "cost model for 'qwen2.5-1.5b', but this run simulates 'tiny'" in capsys.readouterr().err
    assert main(["run", "--trace", str(trace_csv), "--cost", str(cal), "--gpu", "a10"]) == 2
    assert "times passes on NVIDIA H200; drop --gpu" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--policy", "fastest"], "argument --policy: invalid choice: 'fastest' (choose from 'static', 'continuous'"),
    (["--cost", "roofline:h900"], "unknown GPU preset 'h900'"),
    (["--kv-blocks", "100"], "--kv-blocks 100 holds 1,600 tokens (100 blocks of --block-size 16), fewer than one "
                             "request of --max-model-len 32,768"),
    (["--kv-gib", "1e-300"], "--kv-gib 1e-300 holds 0 tokens"),
    (["--kv-gib", "500"], "--kv-gib 500 (500.0 GiB of KV cache) and qwen2.5-1.5b's weights (2.9 GiB) do not fit in "
                          "NVIDIA H200's 131.3 GiB: at most 128.4 GiB of cache"),
    (["--kv-blocks", "10000000", "--cost", "roofline:a10"], "do not fit in NVIDIA A10's 22.4 GiB"),
    (["--block-size", "1000000000000"], "the KV memory of NVIDIA H200 holds 0 tokens"),
    (["--disaggregate", "two"], "expected P:D"),
    (["--seed", "-1", "--rate", "5"], "--seed must be at least 0, got -1"),
    (["--overhead-ms", "1e308"], "--overhead-ms must be at most 1e+11"),
    (["--cost", "constant:1e300"], "a pass must take a finite, positive time of at most 1e+08 s"),
    (["--preemption", "swap", "--swap-gbs", "1e-300"], "--swap-gbs must be at least 1e-06"),
    (["--disaggregate", "1:1", "--kv-link-gbs", "1e-300"], "--kv-link-gbs must be at least 1e-06"),
    (["--disaggregate", "1:1", "--kv-link-latency-ms", "1e300"], "--kv-link-latency-ms must be at most 1e+11"),
    (["--policy", "static", "--batch-timeout-s", "1e300"], "--batch-timeout-s must be at most 1e+08"),
    (["--out", "/proc/simulated"], "--out /proc/simulated: cannot write in /proc"),
])
def test_bad_input_is_a_clear_error(trace_csv, capsys, args, message):
    assert main(["run", "--trace", str(trace_csv), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("change, message", [
    (lambda c: c["parameters"]["decode1"].update(fixed_s=1e300), "parameters.decode1.fixed_s must be at most 1e+08 s"),
    (lambda c: c["parameters"]["prefill"].update(weight_gbs=1e-300), "parameters.prefill.weight_gbs must be 0 (term off) or"),
    (lambda c: c["decode_attention"].update(small=[0, 0]), "decode_attention.small[0] must hold whole numbers >= 1"),
    (lambda c: c.update(free_gib="x"), "free_gib must be a finite number > 0, got 'x'"),
    (lambda c: c["constants"].update(weight_bytes=-1.0), "constants.weight_bytes must be a finite number > 0"),
    (lambda c: c["parameters"]["decode"]["graph_s"].update({"1": float("nan")}), "line 1: NaN is not a number"),
    (lambda c: c["parameters"]["decode"]["big"].update(block_s="x"), "parameters.decode.big.block_s must be a finite number"),
])
def test_a_bad_calibration_file_is_named_with_its_key(trace_csv, tmp_path, capsys, change, message):
    from test_sim_cost import calibration
    cal = calibration(free_gib=10)
    change(cal)
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(cal))
    assert main(["run", "--trace", str(trace_csv), "--cost", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}") and message in err and err.count("\n") == 1, err
    assert err.count(str(path)) == 1  # named once, not twice
    assert not (tmp_path / "out").exists()


def test_a_bad_trace_or_router_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens\n1.0,10,10\n0.5,10,10\n")
    assert main(["run", "--trace", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.csv, line 3" in err and "time order" in err  # traces.io names the line
    assert main(["run", "--trace", str(tmp_path / "missing.csv")]) == 2
    assert main(["run", "--trace", str(bad), "--router", "random"]) == 2
    assert "invalid choice: 'random'" in capsys.readouterr().err


def test_sweep_runs_a_grid_with_replications(trace_csv, tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", "--trace", str(trace_csv), "--policy", "continuous,chunked", "--rate", "10,40",
                 "--replications", "2", "--jobs", "2", "--out", str(out)]) == 0
    import pandas as pd
    runs, summary = pd.read_csv(out / "runs.csv"), pd.read_csv(out / "summary.csv")
    assert len(runs) == 8 and len(summary) == 4
    assert set(summary["policy"]) == {"continuous", "chunked"} and (summary["replications"] == 2).all()
    assert summary["mean_ttft_ms_ci"].notna().all()


@pytest.mark.parametrize("args, message", [
    (["--kv-blocks", "100", "--replicas", "1,2"], "--kv-blocks 100 holds 1,600 tokens"),
    (["--disaggregate", "1:1", "--policy", "continuous,static"], "disaggregation needs a continuous policy"),
])
def test_a_sweep_with_a_bad_point_fails_before_any_point_runs(trace_csv, tmp_path, capsys, args, message):
    assert main(["sweep", "--trace", str(trace_csv), *args, "--out", str(tmp_path / "sweep")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "sweep").exists()  # not even an empty runs.csv


def test_help_runs():
    out = subprocess.run([sys.executable, "-m", "sim", "run", "--help"], capture_output=True, text=True, check=True)
    assert "--policy" in out.stdout and "--cost" in out.stdout


def test_the_simulator_never_imports_torch_and_the_policy_never_imports_simpy():
    code = ("import sys, sim.__main__, sim.build, sim.sweep; assert 'torch' not in sys.modules, 'torch'; "
            "[sys.modules.pop(m) for m in list(sys.modules) if m.startswith(('sim', 'simpy'))]; "
            "import core.scheduler, core.kv; assert 'simpy' not in sys.modules, 'simpy'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_mooncake_trace_drives_the_prefix_cache(tmp_path, capsys):
    path = tmp_path / "mooncake.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 100 * i, "input_length": 1500, "output_length": 20,
                                        "hash_ids": [7, 8, 100 + i]}) + "\n" for i in range(30)))
    assert main(["run", "--trace", str(path), "--policy", "chunked", "--prefix-caching"]) == 0
    text = capsys.readouterr().out
    # every prompt after the first finds the shared 1,024-token prefix
    assert "prefix cache: 29,696 prompt tokens hit" in text and "Successful requests:                    30" in text


def test_a_resumed_sweep_runs_only_the_points_runs_csv_lacks(trace_csv, tmp_path, capsys):
    out = tmp_path / "sweep"
    args = ["sweep", "--trace", str(trace_csv), "--policy", "continuous,chunked", "--rate", "10", "--limit", "40",
            "--jobs", "1", "--out", str(out)]
    assert main(args) == 0
    lines = (out / "runs.csv").read_text().splitlines()
    assert len(lines) == 3
    (out / "runs.csv").write_text("\n".join(lines[:2]) + "\n")  # as if interrupted after the first run
    assert main([*args, "--resume"]) == 0
    again = (out / "runs.csv").read_text().splitlines()
    assert len(again) == 3 and again[:2] == lines[:2]  # the kept run is not run again
    assert {line.split(",")[0] for line in again[1:]} == {"continuous", "chunked"}


def test_a_sweep_over_cost_models_and_a_runs_csv_from_before_cost_was_an_axis(trace_csv, tmp_path, capsys):
    import pandas as pd
    out = tmp_path / "sweep"
    args = ["sweep", "--trace", str(trace_csv), "--cost", "constant:0.002,constant:0.002*2", "--rate", "10",
            "--limit", "40", "--jobs", "1", "--out", str(out)]
    assert main(args) == 0
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs.cost) == ["constant:0.002", "constant:0.002*2"]
    fast, slow = runs.mean_e2el_ms
    assert slow > fast  # every pass twice as long
    # a runs.csv written before cost was an axis has no cost column: resuming it is refused, clearly
    frame = pd.read_csv(out / "runs.csv").drop(columns="cost")
    frame.iloc[:1].to_csv(out / "runs.csv", index=False)
    capsys.readouterr()
    assert main([*args, "--resume"]) == 2
    err = capsys.readouterr().err
    assert "runs.csv: no column cost (written by an older version of the simulator)" in err
    assert len(pd.read_csv(out / "runs.csv")) == 1  # and nothing was lost


@pytest.mark.parametrize("extra", [[], ["--noise"]])
def test_a_scaled_calibration_keeps_the_memory_the_calibrated_engine_had(trace_csv, tmp_path, capsys, extra):
    # a calibration whose engine had too little memory for one request: the scaled (and the
    # scattered) model must size the KV cache from it too, not from the GPU preset
    d = json.loads((REPO / "sim" / "calibrations" / "qwen2.5-1.5b" / "h200.json").read_text())
    d["free_gib"] = 0.001
    path = tmp_path / "small.json"
    path.write_text(json.dumps(d))
    for cost in (str(path), f"{path}*1.02"):
        assert main(["run", "--trace", str(trace_csv), "--cost", cost, *extra]) == 2
        err = capsys.readouterr().err
        assert "the KV memory of NVIDIA H200 (0.001 GiB) holds" in err, err


def test_requests_longer_than_the_context_are_rejected_and_said_why(tmp_path, capsys):
    trace = tmp_path / "long.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,100000,10\n0.1,100,5\n0.2,40000,3\n0.3,50,2\n")
    assert main(["run", "--trace", str(trace), "--out", str(tmp_path / "out")]) == 0
    out, err = capsys.readouterr()
    assert "Successful requests:                    2" in out and "Rejected requests:                      2" in out
    # one line for the kind of reason, how many, which requests, and the first one's numbers
    assert "2 requests rejected (0, 2): e.g. prompt 100000 + output 10 = 100010 tokens exceeds max_model_len" in err
    assert main(["metrics", str(tmp_path / "out")]) == 0  # the records keep the reasons
    assert "2 requests rejected (0, 2)" in capsys.readouterr().err


def test_metric_percentiles_choose_the_printed_ones_as_vllm_and_rows_keep_the_usual(trace_csv, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--trace", str(trace_csv), "--metric-percentiles", "25,99.9", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "P25 TTFT (ms):" in table and "P99.9 E2EL (ms):" in table and "P90 TTFT" not in table
    metrics = json.loads((out / "metrics.json").read_text())
    keys = set(metrics.get("metrics", metrics))
    assert {"p25_ttft_ms", "p99.9_ttft_ms", "p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms"} <= keys
    assert main(["metrics", str(out), "--metric-percentiles", "10"]) == 0
    table = capsys.readouterr().out
    assert "P10 TPOT (ms):" in table and "P99 TPOT" not in table
    assert main(["run", "--trace", str(trace_csv), "--metric-percentiles", "50,100"]) == 2
    assert "a percentile must be above 0 and below 100, got 100" in capsys.readouterr().err
