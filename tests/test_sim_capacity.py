"""`python -m sim capacity`: bisection against thresholds worked out by hand, replications and
their confidence intervals, clear errors, and the --modal fan-out with an injected mapper."""
import dataclasses
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import sim.fanout
from core.metrics import confidence_interval
from sim.__main__ import main
from sim.build import RunSpec
from sim.capacity import Bisection, parse_slos
from sim.fanout import point_row
from traces.generate import poisson

C = 0.004  # every pass takes 4 ms (constant cost); one request per pass (--max-num-seqs 1)
ONE_PER_PASS = ["--cost", f"constant:{C}", "--max-num-seqs", "1", "--jobs", "1"]


def write_trace(path, n, gap_s, output_tokens=1):
    rows = ["arrival_s,prompt_tokens,output_tokens"] + [f"{i * gap_s:.6f},10,{output_tokens}" for i in range(n)]
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture
def evenly(tmp_path):
    """200 requests 10 ms apart, one output token each: a D/D/1 queue with 4 ms service."""
    return write_trace(tmp_path / "evenly.csv", 200, 0.010)


def test_rate_scale_search_finds_the_hand_computed_threshold(evenly, tmp_path, capsys):
    # Sped up s times the gap is d = 10 ms / s. While d >= C every TTFT is C; below, the server is
    # never idle and request i's TTFT is C + i (C - d), so np.percentile's p99 (position
    # k = 0.99 (n - 1), linear in i) is C + k (C - d). It meets 10 ms while d >= C - (10 ms - C) / k.
    k = 0.99 * 199
    threshold = 0.010 / (C - (0.010 - C) / k)
    assert main(["capacity", "--trace", str(evenly), "--search", "rate-scale", "--slo", "ttft:p99:10",
                 "--tolerance", "0.01", "--out", str(tmp_path / "out"), *ONE_PER_PASS]) == 0
    (row,) = pd.read_csv(tmp_path / "out" / "capacity.csv").to_dict("records")
    assert row["max_rate_scale"] <= threshold < row["fails_at"] <= row["max_rate_scale"] * 1.01
    p99 = C + k * (C - 0.010 / row["max_rate_scale"])
    assert row["p99_ttft_ms"] == pytest.approx(p99 * 1e3, rel=1e-9)
    probes = pd.read_csv(tmp_path / "out" / "probes.csv")
    assert list(probes.rate_scale[:3]) == [1, 2, 4] and list(probes.meets[:3]) == [True, True, False]
    assert row["probes"] == len(probes) and (probes.meets == (probes.rate_scale <= threshold)).all()
    assert "max_rate_scale" in capsys.readouterr().out


def test_one_search_per_cost_model_and_a_slower_one_serves_less(evenly, tmp_path, capsys):
    # the hand-computed threshold above, for passes of C and of 1.5 C (`constant:C*1.5`)
    k = 0.99 * 199
    threshold = {c: 0.010 / (c - (0.010 - c) / k) for c in (C, 1.5 * C)}
    assert main(["capacity", "--trace", str(evenly), "--search", "rate-scale", "--slo", "ttft:p99:10",
                 "--tolerance", "0.01", "--out", str(tmp_path / "out"), *ONE_PER_PASS,
                 "--cost", f"constant:{C},constant:{C}*1.5"]) == 0
    rows = pd.read_csv(tmp_path / "out" / "capacity.csv").to_dict("records")
    assert [r["cost"] for r in rows] == [f"constant:{C}", f"constant:{C}*1.5"]
    for row, c in zip(rows, (C, 1.5 * C)):
        assert row["max_rate_scale"] <= threshold[c] < row["fails_at"] <= row["max_rate_scale"] * 1.01
    assert rows[1]["max_rate_scale"] < rows[0]["max_rate_scale"]
    assert f"constant:{C}*1.5" in capsys.readouterr().out


def test_fewest_replicas(tmp_path):
    # 120 requests 3 ms apart, 10 ms passes, round robin: R replicas see a gap of 3R ms, so the
    # queues stay empty from R = 4 (TTFT = 10 ms); at R = 3 each grows 1 ms per request.
    trace = write_trace(tmp_path / "t.csv", 120, 0.003)
    assert main(["capacity", "--trace", str(trace), "--search", "replicas", "--slo", "ttft:p99:15",
                 "--cost", "constant:0.010", "--max-num-seqs", "1", "--jobs", "1", "--out", str(tmp_path / "o")]) == 0
    (row,) = pd.read_csv(tmp_path / "o" / "capacity.csv").to_dict("records")
    assert (row["min_replicas"], row["fails_at"], row["p99_ttft_ms"]) == (4, 3, pytest.approx(10.0))
    assert list(pd.read_csv(tmp_path / "o" / "probes.csv").replicas) == [1, 2, 4, 3]


def test_rate_search_with_replications_reports_confidence_intervals(tmp_path, capsys):
    trace = write_trace(tmp_path / "t.csv", 150, 0.01)
    out = tmp_path / "out"
    assert main(["capacity", "--trace", str(trace), "--slo", "ttft:p99:12", "ttft:mean:6", "--replications", "3",
                 "--policy", "continuous,chunked", "--out", str(out), *ONE_PER_PASS]) == 0
    table = pd.read_csv(out / "capacity.csv")
    probes = pd.read_csv(out / "probes.csv")
    assert list(table.policy) == ["continuous", "chunked"] and (probes.replications == 3).all()
    assert (table.runs == 3 * table.probes).all() and table.p99_ttft_ms_ci.notna().all()
    for row in table.to_dict("records"):
        # The same probe worked out by hand: Poisson arrivals with seeds 0, 1, 2 (the draws the
        # simulator makes), one server, 4 ms each: Lindley's recursion gives every TTFT.
        p99s = []
        for seed in range(3):
            arrival = poisson(row["max_rate"], n=150, seed=seed).arrival_s
            free, ttft = 0.0, []
            for a in arrival:
                free = max(free, a) + C
                ttft.append(free - a)
            p99s.append(np.percentile(ttft, 99) * 1e3)
        mean, half = confidence_interval(p99s)
        assert (row["p99_ttft_ms"], row["p99_ttft_ms_ci"]) == (pytest.approx(mean, rel=1e-9), pytest.approx(half))
        assert row["p99_ttft_ms"] <= 12 and row["mean_ttft_ms"] <= 6
        mine = probes[probes.policy == row["policy"]]
        assert not mine[mine.rate == row["fails_at"]].meets.item()
        assert row["fails_at"] - row["max_rate"] <= 0.02 * row["max_rate"]
    assert "p99_ttft_ms_ci" in capsys.readouterr().out


def test_a_slo_that_requests_served_alone_miss_stops_the_search(evenly, tmp_path, capsys):
    # 10 ms apart every request is served alone in 4 ms; at half the rate nothing changes: stop.
    assert main(["capacity", "--trace", str(evenly), "--search", "rate-scale", "--slo", "ttft:p99:3",
                 "--out", str(tmp_path / "o"), *ONE_PER_PASS]) == 0
    (row,) = pd.read_csv(tmp_path / "o" / "capacity.csv").to_dict("records")
    assert math.isnan(row["max_rate_scale"]) and (row["fails_at"], row["probes"]) == (0.5, 2)
    assert "no probe met the SLOs; the last, rate_scale 0.5, measured p99 ttft 4 ms" in capsys.readouterr().out


def test_bisection_steps():
    b = Bisection(start=10)
    for value, meets in ((10, True), (20, True), (40, False), (30, False), (25, True)):
        assert b.next_value() == value
        b.record(value, meets)
    assert b.next_value() == 27.5 and b.probes_left() == math.ceil(math.log2((30 - 25) / (0.02 * 25)))
    never = Bisection(start=1, fewest=True)
    for _ in range(13):
        never.record(never.next_value(), False)
    assert never.next_value() is None and never.good is None and never.bad == 4096
    always = Bisection(start=8, fewest=True)
    for value in (8, 4, 2, 1):
        assert always.next_value() == value
        always.record(value, True)
    assert always.next_value() is None and always.good == 1
    floored = Bisection(start=1, floor=0.3)  # 0.25 would put arrivals past what a trace may span
    for value in (1, 0.5):
        assert floored.next_value() == value
        floored.record(value, False)
    assert floored.next_value() is None


def test_replications_of_a_deterministic_replay_are_refused(evenly, capsys):
    assert main(["capacity", "--trace", str(evenly), "--search", "rate-scale", "--slo", "ttft:p99:10",
                 "--replications", "2", *ONE_PER_PASS]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --replications: this run draws nothing at random") and err.count("\n") == 1


@pytest.mark.parametrize("args, message", [
    (["--slo", "ttft:200"], "--slo 'ttft:200': expected NAME:STAT:MS"),
    (["--slo", "ttfb:p99:200"], "unknown metric 'ttfb'"),
    (["--slo", "ttft:p95:200"], "unknown statistic 'p95'; choose from mean, p50, p90, p99"),
    (["--slo", "ttft:p99:fast"], "'fast' is not a number of milliseconds"),
    (["--slo", "ttft:p99:-5"], "the limit must be a positive number"),
    (["--slo", "ttft:p99:5", "ttft:p99:6"], "p99 ttft is given twice"),
    (["--slo", "ttft:p99:10", "--rate", "5"], "--rate: --search rate varies it; give the first probe with --start"),
    (["--slo", "ttft:p99:10", "--search", "rate-scale", "--rate", "5"], "--rate: not with --search rate-scale"),
    (["--slo", "ttft:p99:10", "--search", "replicas", "--start", "1.5"], "--start 1.5: a number of replicas"),
    (["--slo", "ttft:p99:10", "--search", "replicas", "--disaggregate", "1:1"], "not with --disaggregate"),
    (["--slo", "ttft:p99:10", "--tolerance", "0"], "--tolerance must be between 0 and 1"),
    (["--slo", "ttft:p99:10", "--search", "warp"], "argument --search: invalid choice: 'warp'"),
    (["--slo", "ttft:p99:10", "--modal"], "--modal: run it on Modal with modal run modal_app.py::capacity"),
    (["--slo", "ttft:p99:10", "--kv-blocks", "10"], "--kv-blocks 10 holds 160 tokens"),
])
def test_bad_input_is_one_line_and_exit_2(evenly, tmp_path, capsys, args, message):
    out = tmp_path / "never"
    assert main(["capacity", "--trace", str(evenly), "--out", str(out), *args]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.err.count("\n") == 1 and captured.out == ""
    assert not out.exists()


def test_parse_slos_gives_the_columns_of_the_metrics_rows():
    assert [s.column for s in parse_slos(["ttft:p99:200", "tpot:mean:20", "itl:p50:5"])] == [
        "p99_ttft_ms", "mean_tpot_ms", "p50_itl_ms"]


class FakeMap:
    """modal_app.simulate_point's .map stood in for by a mapper that records what it is given and
    runs the function's body here."""

    def __init__(self):
        self.calls = []

    def __call__(self, spec_dicts, kwargs):
        self.calls.append((spec_dicts, kwargs))
        return [point_row(d, **kwargs) for d in spec_dicts]


def test_mapped_capacity_maps_the_same_probes(evenly, tmp_path, capsys):
    args = ["capacity", "--trace", str(evenly), "--search", "rate", "--slo", "ttft:p99:10", "--replications", "2",
            "--policy", "continuous,chunked", *ONE_PER_PASS]
    assert main([*args, "--out", str(tmp_path / "local")]) == 0
    local_out = capsys.readouterr().out
    mapper = FakeMap()
    assert main([*args, "--out", str(tmp_path / "modal")], mapper=mapper) == 0
    assert capsys.readouterr().out.splitlines()[:-1] == local_out.splitlines()[:-1]  # all but "written DIR"
    probes = pd.read_csv(tmp_path / "local" / "probes.csv")
    mapped = [(d["policy"], d["rate"], d["seed"]) for dicts, _ in mapper.calls for d in dicts]
    assert sorted(mapped) == sorted((p, r, s) for p, r in zip(probes.policy, probes.rate) for s in (0, 1))
    assert all(kw["trace"] is not None and len(kw["trace"]) == 200 for _, kw in mapper.calls)


def test_mapped_sweep_maps_the_grid(evenly, tmp_path, capsys):
    args = ["sweep", "--trace", str(evenly), "--policy", "continuous,chunked", "--rate", "50,100",
            "--replications", "2", "--goodput", "ttft:10", *ONE_PER_PASS]
    assert main([*args, "--out", str(tmp_path / "local")]) == 0
    mapper = FakeMap()
    assert main([*args, "--out", str(tmp_path / "modal")], mapper=mapper) == 0
    ((dicts, kwargs),) = mapper.calls
    from sim.sweep import grid
    base = RunSpec(trace=str(evenly), cost=f"constant:{C}", max_num_seqs=1, rate=50.0)
    assert dicts == [dataclasses.asdict(s) for s in grid(base, 2, policy=["continuous", "chunked"], rate=[50.0, 100.0])]
    assert kwargs["slos"] == {"ttft": 0.01}
    local, remote = (pd.read_csv(tmp_path / d / "summary.csv") for d in ("local", "modal"))
    pd.testing.assert_frame_equal(local, remote)


def test_a_mapped_sweep_refuses_a_cost_file_the_containers_lack(evenly, tmp_path, capsys):
    out = tmp_path / "never"
    args = ["sweep", "--trace", str(evenly), "--cost", "my.json", "--out", str(out)]
    assert main(args, mapper=FakeMap()) == 2
    assert "--cost 'my.json' is a file on this machine" in capsys.readouterr().err and not out.exists()


def test_modal_apps_sweep_entrypoint_runs_the_simulators_sweep_with_its_mapper(evenly, tmp_path, capsys):
    modal_app = pytest.importorskip("modal_app")
    mapper = FakeMap()
    args = f"--trace {evenly} --policy continuous,chunked --cost constant:{C} --out {tmp_path / 'modal'}"
    assert modal_app.simulator_body("sweep", args, mapper) == 0
    assert len(mapper.calls[0][0]) == 2 and (tmp_path / "modal" / "summary.csv").exists()


def test_the_modal_function_runs_the_same_body(evenly):
    modal_app = pytest.importorskip("modal_app")
    spec = RunSpec(trace=str(evenly), cost=f"constant:{C}", rate=80.0, seed=3)
    from sim.build import load_trace_file
    remote = modal_app.simulate_point.local(dataclasses.asdict(spec), {"ttft": 0.01}, load_trace_file(str(evenly)))
    here = sim.fanout.run_point(spec, {"ttft": 0.01})
    same = lambda a, b: a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))  # noqa: E731
    assert remote.keys() == here.keys() and all(same(remote[k], here[k]) for k in here if k != "wall_s")
    assert remote["completed"] == 200 and remote["rate"] == 80.0 and not math.isnan(remote["p99_ttft_ms"])


def test_the_simulator_does_not_import_modal():
    code = "import sys, sim.__main__, sim.capacity, sim.fanout, sim.sweep; assert 'modal' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
