"""`python -m sim plot`: the charts exist, and what they draw is the records' own values."""
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import sim.plot as plot
from core.metrics import compute_metrics
from core.records import read_pass_records, read_request_records
from core.runstore import RunStore
from sim.__main__ import main


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tiny trace, two simulated runs of it (pass log on) and a sweep with replications."""
    d = tmp_path_factory.mktemp("plot")
    trace = d / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n"
                     + "".join(f"{i * 0.02:.3f},{64 + 29 * i % 200},{4 + 7 * i % 40}\n" for i in range(24)))
    for policy in ("continuous", "chunked"):
        assert main(["run", "--trace", str(trace), "--policy", policy, "--pass-log", "on",
                     "--out", str(d / policy)]) == 0
    assert main(["sweep", "--trace", str(trace), "--policy", "continuous,chunked", "--rate", "20,80",
                 "--replications", "3", "--jobs", "1", "--goodput", "ttft:3", "--out", str(d / "sweep")]) == 0
    return d


def chart_values(chart) -> list[dict]:
    """Every data row a chart carries into its HTML and PNG."""
    return [row for rows in chart.to_dict()["datasets"].values() for row in rows]


def is_png(path) -> bool:
    return path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_of_two_runs_writes_the_cdfs_and_the_over_time_chart(made, tmp_path, capsys):
    out = tmp_path / "charts"
    assert main(["plot", str(made / "continuous"), str(made / "chunked"), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["latency-cdf.html", "latency-cdf.png", "over-time.html",
                                                     "over-time.png"]
    assert is_png(out / "latency-cdf.png") and is_png(out / "over-time.png")
    html = (out / "latency-cdf.html").read_text()
    assert "vega" in html and '"chunked"' in html and '"continuous"' in html


def test_the_cdf_points_are_the_records_sorted_and_the_p99_is_the_runs_own(made):
    runs, sweep = plot.read_runs([made / "continuous"])
    assert sweep is None and runs[0].label == "continuous"
    points, p99 = plot.cdf_frame(runs)
    records = read_request_records(made / "continuous" / "requests.jsonl")
    written = json.loads((made / "continuous" / "metrics.json").read_text())["metrics"]
    for metric, name in plot.LATENCIES:
        values = sorted(getattr(r, f"{metric}_s") * 1e3 for r in records if getattr(r, f"{metric}_s") is not None)
        mine = points[points.metric == name]
        assert np.array_equal(mine["ms"].to_numpy(), values)
        assert np.allclose(mine["fraction"], np.arange(1, len(values) + 1) / len(values))
        assert p99[p99.metric == name]["ms"].item() == pytest.approx(written[f"p99_{metric}_ms"], rel=1e-12)
    drawn = {row["ms"] for row in chart_values(plot.cdf_chart(runs)) if row.get("metric") == "TTFT"}
    assert drawn == set(points[points.metric == "TTFT"]["ms"]) | set(p99[p99.metric == "TTFT"]["ms"])


def test_a_long_cdf_is_drawn_at_evenly_spaced_ranks_of_the_records(made, monkeypatch):
    monkeypatch.setattr(plot, "MAX_CDF_POINTS", 5)
    runs, _ = plot.read_runs([made / "chunked"])
    points, _ = plot.cdf_frame(runs)
    values = plot.latency_values(runs[0].requests, "e2el") * 1e3
    e2el = points[points.metric == "E2EL"]
    assert len(e2el) == 5 and e2el["ms"].iloc[0] == values[0] and e2el["ms"].iloc[-1] == values[-1]
    ranks = np.round(e2el["fraction"].to_numpy() * len(values)).astype(int) - 1
    assert np.array_equal(values[ranks], e2el["ms"].to_numpy())


def test_over_time_draws_each_pass_from_start_to_end(made):
    runs, _ = plot.read_runs([made / "continuous"])
    passes = read_pass_records(made / "continuous" / "passes.jsonl")
    df = plot.over_time_frame(runs)
    batch = df[df.series == "batch size"]
    assert {(p.start_s, p.batch_size) for p in passes} <= set(zip(batch.time_s, batch.value))
    kv = df[df.series == "KV blocks held"]
    expected = {(p.start_s, sum(-(-(c + n) // 16) for c, n in zip(p.context_lens, p.new_tokens))) for p in passes}
    assert expected <= set(zip(kv.time_s, kv.value))
    # the extra points close each busy stretch at its last pass's end; an idle gap starts a new segment
    assert len(batch) == len(passes) + batch.segment.nunique()
    ends = {p.start_s + p.duration_s for p in passes}
    closing = batch.groupby("segment").time_s.max()
    assert set(closing) <= ends
    inside = df[df.series == "requests in the system"]
    records = read_request_records(made / "continuous" / "requests.jsonl")
    for t, n in zip(inside.time_s, inside.value):
        assert n == sum(r.arrival_s <= t < r.finish_s for r in records)


def test_a_long_pass_log_is_drawn_as_the_mean_per_interval(made, monkeypatch):
    monkeypatch.setattr(plot, "MAX_PASS_POINTS", 10)
    monkeypatch.setattr(plot, "TIME_BINS", 7)
    runs, _ = plot.read_runs([made / "continuous"])
    passes = runs[0].passes
    df = plot.over_time_frame(runs)
    batch = df[df.series == "batch size"].drop_duplicates("time_s")
    end = max(max(r.finish_s for r in runs[0].requests), max(p.start_s + p.duration_s for p in passes))
    width = end / 7
    for t, v in zip(batch.time_s, batch.value):
        inside = [p.batch_size for p in passes if t - 1e-12 <= p.start_s < t + width - 1e-12]
        if inside:
            assert v == pytest.approx(np.mean(inside))


def test_the_sweep_chart_draws_summary_csv_means_and_bands(made, tmp_path):
    rows = plot.read_sweep(made / "sweep")
    df, x = plot.sweep_frame(rows)
    assert x == "rate" and set(df.series) == {"continuous", "chunked"} and (df.replications == 3).all()
    summary = pd.read_csv(made / "sweep" / "summary.csv")
    for metric in ("request_throughput", "p99_ttft_ms", "request_goodput"):
        for _, s in summary.iterrows():
            drawn = df[(df.metric == metric) & (df.series == s.policy) & (df.x == s.rate)]
            assert drawn["mean"].item() == pytest.approx(s[metric], rel=1e-12)
            assert drawn["ci"].item() == pytest.approx(s[f"{metric}_ci"], rel=1e-12)
            assert drawn["lo"].item() == pytest.approx(s[metric] - s[f"{metric}_ci"], rel=1e-12)
    p99_e2el = df[df.metric == "p99_e2el_ms"]
    runs = pd.read_csv(made / "sweep" / "runs.csv")
    for _, d in p99_e2el.iterrows():
        reps = runs[(runs.policy == d.series) & (runs.rate == d.x)]["p99_e2el_ms"]
        assert d["mean"] == pytest.approx(reps.mean(), rel=1e-12)
    out = tmp_path / "charts"
    assert main(["plot", str(made / "sweep"), "--slo", "ttft:3", "--out", str(out)]) == 0
    assert is_png(out / "sweep.png") and (out / "sweep.html").stat().st_size > 1000
    slo_rules = [row for row in chart_values(plot.sweep_chart(rows, {"ttft": 0.003}, "s")) if "label" in row]
    assert slo_rules == [{"y": 3.0, "label": "SLO 3 ms"}]


def test_an_engine_run_directory_is_read_through_its_run_store(made, tmp_path):
    store = RunStore(tmp_path / "continuous")
    requests = read_request_records(made / "chunked" / "requests.jsonl")
    passes = read_pass_records(made / "chunked" / "passes.jsonl")
    store.write_run("seed-r5-chunked-x", passes, requests, {"run_id": "seed-r5-chunked-x", "block_size": 16,
                                                            "kv_blocks": 4096, "policy": "chunked"})
    runs, _ = plot.read_runs([tmp_path / "continuous" / "seed-r5-chunked-x"])
    assert runs[0].label == "seed-r5-chunked-x" and runs[0].kv_blocks == 4096 and len(runs[0].passes) == len(passes)
    assert plot.cdf_frame(runs)[1].equals(plot.cdf_frame(plot.read_runs([made / "chunked"])[0])[1].assign(
        run="seed-r5-chunked-x"))
    assert "4,096 blocks" in json.dumps(plot.over_time_chart(runs).to_dict())
    assert compute_metrics(runs[0].requests).completed == len(requests)


def test_replications_are_one_run_each(made, tmp_path, capsys):
    trace = made / "trace.csv"
    out = tmp_path / "reps"
    assert main(["run", "--trace", str(trace), "--rate", "40", "--replications", "2", "--out", str(out)]) == 0
    runs, _ = plot.read_runs([out])
    assert [r.label for r in runs] == ["continuous, seed 0", "continuous, seed 1"]


@pytest.mark.parametrize("case, message", [
    ("missing", "no such directory"),
    ("empty", "empty directory, nothing to plot"),
    ("file", "not a directory"),
    ("other", "not a run or sweep directory"),
    ("engine-root", "an engine's results directory; give one run's directory under it"),
    ("no-rate", "the sweep varies neither --rate nor --rate-scale"),
    ("empty-runs", "no request records"),
])
def test_a_directory_it_cannot_plot_is_a_one_line_error_and_writes_nothing(made, tmp_path, capsys, case, message):
    d = tmp_path / case
    if case != "missing":
        d.mkdir() if case != "file" else d.write_text("x")
    if case == "other":
        (d / "notes.txt").write_text("x")
    if case == "engine-root":
        (d / "runs.jsonl").write_text("{}\n")
    if case == "no-rate":
        pd.read_csv(made / "sweep" / "runs.csv").query("rate == 20").to_csv(d / "runs.csv", index=False)
    if case == "empty-runs":
        (d / "requests.jsonl").write_text("")
    out = tmp_path / "charts"
    assert main(["plot", str(d), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {d}") and message in err and err.count("\n") == 1
    assert not out.exists()


def test_bad_options_are_one_line_errors(made, tmp_path, capsys):
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    for args, message in ((["--slo", "ttft"], "--slo: goodput SLO 'ttft'"),
                          (["--out", str(full)], "directory is not empty"),
                          (["--out", str(made / "chunked"), "--overwrite"], "would replace"),
                          (["--out", str(made)], "would replace")):
        argv = ["plot", str(made / "chunked"), *args] + ([] if "--out" in args else ["--out", str(tmp_path / "c")])
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error:") and message in err and err.count("\n") == 1, err
    assert (made / "chunked" / "requests.jsonl").exists() and not (tmp_path / "c").exists()
    assert main(["plot", str(made / "sweep"), str(made / "sweep"), "--out", str(tmp_path / "c")]) == 2
    assert "one sweep directory at a time" in capsys.readouterr().err


def test_the_charts_load_no_torch():
    code = ("import sys, sim.__main__, sim.plot, sim.compare, sim.sweep, altair, vl_convert; "
            "assert 'torch' not in sys.modules, 'torch'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_run_written_in_another_format_is_read_the_same(made, tmp_path, fmt):
    if fmt == "parquet":
        pytest.importorskip("pyarrow", reason="--format parquet needs the parquet extra")
    out = tmp_path / fmt
    assert main(["run", "--trace", str(made / "trace.csv"), "--policy", "continuous", "--format", fmt,
                 "--out", str(out)]) == 0
    assert not (out / "requests.jsonl").exists()
    assert plot.kind_of(out) == "run"
    got = plot.read_sim_run(out).requests
    want = read_request_records(made / "continuous" / "requests.jsonl")
    assert [(r.request_id, r.first_token_s, r.finish_s) for r in got] == \
        [(r.request_id, r.first_token_s, r.finish_s) for r in want]
