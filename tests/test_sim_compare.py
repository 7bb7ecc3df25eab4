"""`python -m sim compare` on a committed fixture: a real open run of the tiny model on a CPU
(tests/fixtures/compare-tiny, made by
`python -m engine serve-trace --trace tests/fixtures/compare-tiny/trace.csv --model tiny --device cpu --policy continuous --out tests/fixtures/compare-tiny`)
replayed in the simulator with a constant pass cost, so that both sides of the error table can be
computed by hand: the real side from the records, the simulated side from the trace (its
requests arrive 0.25 s apart and each is done in at most 6 passes of 10 ms, so none waits)."""
import argparse
import csv
import gzip
import json
import shutil
from pathlib import Path

import pytest

from sim.__main__ import main as sim_main
from sim.compare import run_compare, targets

FIXTURE = Path(__file__).parent / "fixtures" / "compare-tiny"
COST = 0.01


def percentile(values, q):
    """numpy's default (linear) percentile, by hand."""
    v = sorted(values)
    rank = q / 100 * (len(v) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (rank - lo) * (v[hi] - v[lo])


def real_records():
    (run_dir,) = [p for p in (FIXTURE / "continuous").iterdir() if p.is_dir()]
    with gzip.open(run_dir / "requests.jsonl.gz", "rt") as f:
        requests = [json.loads(line) for line in f]
    with gzip.open(run_dir / "passes.jsonl.gz", "rt") as f:
        passes = [json.loads(line) for line in f]
    return requests, passes


@pytest.fixture(scope="module")
def comparison():
    (c,) = run_compare(FIXTURE, f"constant:{COST}")
    return c


def test_error_table_matches_a_hand_computation(comparison):
    requests, _ = real_records()
    ttft = [r["first_token_s"] - r["arrival_s"] for r in requests]
    e2el = [r["finish_s"] - r["arrival_s"] for r in requests]
    tpot = [(r["finish_s"] - r["first_token_s"]) / (r["output_tokens"] - 1) for r in requests]
    outputs = [r["output_tokens"] for r in requests]
    sim = {"ttft": [COST] * 4, "tpot": [COST] * 4, "e2el": [COST * n for n in outputs]}
    real = {"ttft": ttft, "tpot": tpot, "e2el": e2el}
    table = {(t["metric"], t["stat"]): t for t in comparison.table}
    for metric in ("ttft", "tpot", "e2el"):
        for stat, q in (("p50", 50), ("p90", 90), ("p99", 99)):
            row = table[metric, stat]
            want_real, want_sim = percentile(real[metric], q), percentile(sim[metric], q)
            assert row["real_ms"] == pytest.approx(want_real * 1e3, rel=1e-9)
            assert row["sim_ms"] == pytest.approx(want_sim * 1e3, rel=1e-9)
            assert row["error"] == pytest.approx(want_sim / want_real - 1, rel=1e-9)
        mean = table[metric, "mean"]
        assert mean["real_ms"] == pytest.approx(sum(real[metric]) / 4 * 1e3, rel=1e-9)


def test_diagnosis_prices_the_runs_own_passes(comparison):
    _, passes = real_records()
    measured = sum(p["duration_s"] for p in passes)
    assert comparison.diagnosis["pass_cost_error"] == pytest.approx(COST * len(passes) / measured - 1, rel=1e-9)
    assert comparison.diagnosis["saturated"] is False
    (check,) = targets([comparison])
    assert check["met"] is False and check["worst_p50_p90"] > 0.05  # 10 ms against a slow CPU run


def test_cli_writes_the_report_and_tables(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(FIXTURE, results)
    out = tmp_path / "validation"
    assert sim_main(["compare", "--results", str(results), "--cost", f"constant:{COST}", "--out", str(out)]) == 0
    for name in ("errors.csv", "targets.csv", "report.html"):
        assert (out / name).stat().st_size > 0
    rows = list(csv.DictReader(open(out / "errors.csv")))
    assert {r["metric"] for r in rows} >= {"ttft", "tpot", "itl", "e2el", "output_throughput"}
    assert "<img" in (out / "report.html").read_text() or "<svg" in (out / "report.html").read_text()


def test_runs_of_one_setup_under_continuous_are_each_others_repeats(tmp_path, capsys):
    """A second run of the fixture's setup under continuous/ (its records, 10% slower at every
    moment) is a repeat of the first, and the first of it: no continuous-repeats/ needed."""
    results = tmp_path / "results"
    shutil.copytree(FIXTURE, results)
    store = results / "continuous"
    (row,) = [json.loads(line) for line in open(store / "runs.jsonl")]
    again = dict(row, run_id=row["run_id"] + "-again",
                 **{k: v * 1.1 for k, v in row.items() if k.endswith("_ms") and isinstance(v, float)})
    shutil.copytree(store / row["run_id"], store / again["run_id"])
    with open(store / "runs.jsonl", "a") as f:
        f.write(json.dumps(again) + "\n")
    out = tmp_path / "validation"
    assert sim_main(["compare", "--results", str(results), "--cost", f"constant:{COST}", "--no-charts",
                     "--out", str(out)]) == 0
    checks = {r["run_id"]: r for r in csv.DictReader(open(out / "targets.csv"))}
    assert [checks[r]["repeats"] for r in (row["run_id"], again["run_id"])] == ["1", "1"]
    # each one's repeat spread is the other's 10% (1.1 - 1 one way, 1/1.1 - 1 the other)
    assert float(checks[row["run_id"]]["repeat_worst_p50_p90"]) == pytest.approx(0.1)
    assert float(checks[again["run_id"]]["repeat_worst_p50_p90"]) == pytest.approx(1 - 1 / 1.1)
    assert "measured more than once (results/continuous, continuous-repeats): 2" in capsys.readouterr().out


def test_no_open_runs_is_a_one_line_error(tmp_path, capsys):
    assert sim_main(["compare", "--results", str(tmp_path), "--cost", f"constant:{COST}", "--no-charts"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no open runs" in err[0]


def repeat_of(row: dict, scale: dict, run_id: str) -> dict:
    """`row` measured again: the named stats scaled (e.g. {("ttft", "p50"): 1.2})."""
    out = dict(row, run_id=run_id)
    for (metric, stat), factor in scale.items():
        out[f"{stat}_{metric}_ms"] = row[f"{stat}_{metric}_ms"] * factor
    return out


def test_repeat_spread_is_the_worst_real_against_real_difference(comparison):
    row = comparison.row
    repeats = [repeat_of(row, {("ttft", "p50"): 1.2}, "again-1"), repeat_of(row, {("ttft", "p50"): 0.7}, "again-2"),
               repeat_of(row | {"policy": "chunked"}, {("ttft", "p50"): 3.0}, "another-policy"), row,
               repeat_of(row, {("ttft", "p99"): 1.1}, row["run_id"])]  # another GPU's run can have the same id
    from sim.compare import repeat_spread, repeats_of
    same = repeats_of(row, repeats)
    assert len(same) == 3  # not the other policy's run, not the run itself
    # a trace served from another folder is the same workload; another trace is not
    traced = row | {"workload": ".traces/AzureLLMInferenceTrace_conv.csv"}
    assert repeats_of(traced, [traced | {"workload": "/data/AzureLLMInferenceTrace_conv.csv", "run_id": "x"},
                               traced | {"workload": ".traces/AzureLLMInferenceTrace_code.csv", "run_id": "y"}]) == \
        [traced | {"workload": "/data/AzureLLMInferenceTrace_conv.csv", "run_id": "x"}]
    spread = repeat_spread(row, same)
    assert spread["ttft", "p50"] == pytest.approx(0.3)
    assert spread["tpot", "p99"] == 0.0
    (check,) = targets([comparison], repeats)
    assert check["repeats"] == 3 and check["repeat_worst_p50_p90"] == pytest.approx(0.3)
    assert check["repeat_worst_p99"] == pytest.approx(0.1)
    # the fixture's simulated errors are far beyond 30% on some metric (10 ms passes against a slow CPU run)
    assert check["met_against_range"] is False
    # a repeat that measured exactly what the simulator says: every error against the range is 0
    table = {(t["metric"], t["stat"]): t for t in comparison.table}
    keys = [k for k in table if k[0] in ("ttft", "tpot", "e2el") and k[1] in ("p50", "p90", "p99")]
    as_simulated = repeat_of(row, {k: table[k]["sim_ms"] / table[k]["real_ms"] for k in keys}, "as-simulated")
    (check,) = targets([comparison], [as_simulated])
    assert check["met"] is False and check["met_against_range"] is True
    assert check["range_worst_p50_p90"] == 0.0 and check["range_worst_p99"] == 0.0
    # (every simulated value of the fixture is below the real run's: 10 ms passes against a slow CPU run)
    assert all(table[k]["sim_ms"] < table[k]["real_ms"] for k in keys)
    # a repeat 4% above the simulated TTFT p50 and equal elsewhere: TTFT p50 is 1/1.04 - 1 under the range
    near = repeat_of(as_simulated, {("ttft", "p50"): 1.04}, "near")
    (check,) = targets([comparison], [near])
    assert check["range_worst_p50_p90"] == pytest.approx(1 - 1 / 1.04) and check["met_against_range"] is True
    # a repeat 20% above the simulated TPOT p99: 1/1.2 - 1 = -16.7% under the range, beyond p99's 10%
    far = repeat_of(as_simulated, {("tpot", "p99"): 1.2}, "far")
    (check,) = targets([comparison], [far])
    assert check["range_worst_p99"] == pytest.approx(1 - 1 / 1.2) and check["met_against_range"] is False


def test_a_subset_of_the_runs_does_not_replace_the_report(tmp_path, monkeypatch):
    import sim.__main__ as cli
    results = tmp_path / "results"
    shutil.copytree(FIXTURE, results)
    monkeypatch.setattr(cli, "REPO", tmp_path / "repo")
    assert sim_main(["compare", "--results", str(results), "--cost", f"constant:{COST}", "--only", "trace",
                     "--no-charts"]) == 0
    assert not (results / "validation").exists()
    assert (tmp_path / "repo" / "out" / "validation" / "targets.csv").exists()


@pytest.mark.parametrize("option", [[], ["--only", "trace"], ["--cost", "calibrated:h200*1.02"], ["--seeds", "0"],
                                    ["--cost-error", "0"], ["--card-offset", False], ["--out", "elsewhere"]])
def test_only_the_default_options_write_the_committed_report(tmp_path, monkeypatch, option):
    import sim.__main__ as cli
    monkeypatch.setattr(cli, "REPO", tmp_path / "repo")
    args = argparse.Namespace(out=None, only=None, cost="calibrated:h200", seeds=5, cost_error=0.02,
                              card_offset=True, results=tmp_path / "results")
    for name, value in zip(option[::2], option[1::2]):
        setattr(args, name[2:].replace("-", "_"), {"--seeds": int, "--cost-error": float, "--card-offset": bool,
                                                   "--out": Path}.get(name, str)(value))
    expected = (tmp_path / "results" / "validation" if not option else
                Path("elsewhere") if option[0] == "--out" else tmp_path / "repo" / "out" / "validation")
    assert cli.report_dir(args) == expected


@pytest.fixture(scope="module")
def moved():
    """The fixture's comparison with every pass also 2% shorter and longer."""
    (c,) = run_compare(FIXTURE, f"constant:{COST}", cost_error=0.02)
    return c


def test_the_cost_error_moves_each_statistic_by_hand(moved):
    # a constant 10 ms pass and no queueing: every simulated statistic scales with the pass's cost
    table = {(t["metric"], t["stat"]): t for t in moved.table}
    for metric in ("ttft", "tpot", "e2el"):
        for stat in ("p50", "p90", "p99", "mean"):
            row = table[metric, stat]
            assert row["cost_lo_ms"] == pytest.approx(0.98 * row["sim_ms"], rel=1e-9)
            assert row["cost_hi_ms"] == pytest.approx(1.02 * row["sim_ms"], rel=1e-9)
    assert moved.diagnosis["cost_error"] == 0.02
    assert "every pass 2% shorter or longer puts TTFT p50 at" in moved.diagnosis["verdict"]
    # the real run is slower than 10 ms passes: each error is the upper end's, 1.02 * sim / real - 1
    keys = [k for k in table if k[0] in ("ttft", "tpot", "e2el") and k[1] in ("p50", "p90", "p99")]
    assert all(table[k]["cost_hi_ms"] < table[k]["real_ms"] for k in keys)
    (check,) = targets([moved])
    want = max(abs(1.02 * table[k]["sim_ms"] / table[k]["real_ms"] - 1) for k in keys if k[1] != "p99")
    assert check["cost_worst_p50_p90"] == pytest.approx(want, rel=1e-9)
    assert check["met_within_cost_error"] is False
    # the report page sets each statistic's moved interval beside its error
    from sim.compare import report_page
    page = report_page([moved], [check], {}, f"constant:{COST}")
    p50 = table["ttft", "p50"]
    lo, hi = (p50[k] / p50["real_ms"] - 1 for k in ("cost_lo_ms", "cost_hi_ms"))
    assert "every pass 2% shorter / longer" in page and f"{lo:+.1%} .. {hi:+.1%}" in page


def test_a_real_value_between_the_moved_simulations_has_no_error(moved):
    import dataclasses
    keys = {(m, s) for m in ("ttft", "tpot", "e2el") for s in ("p50", "p90", "p99")}
    # the real run as if it had measured 1% over the simulation (inside 0.98-1.02) everywhere,
    # and then 4% over it at TTFT p50 (2% past the upper end: 1.02 / 1.04 - 1)
    inside = [t | {"real_ms": t["sim_ms"] * 1.01} if (t["metric"], t["stat"]) in keys else t for t in moved.table]
    (check,) = targets([dataclasses.replace(moved, table=inside)])
    assert check["cost_worst_p50_p90"] == 0.0 and check["cost_worst_p99"] == 0.0
    assert check["met_within_cost_error"] is True
    past = [t | {"real_ms": t["sim_ms"] * 1.04} if (t["metric"], t["stat"]) == ("ttft", "p50") else t for t in inside]
    (check,) = targets([dataclasses.replace(moved, table=past)])
    assert check["cost_worst_p50_p90"] == pytest.approx(1 - 1.02 / 1.04, rel=1e-9)
    assert check["met_within_cost_error"] is True  # 1.9% is within p50's 5%
    # without the moved simulations (cost_error 0) there is no such column
    (check,) = targets([dataclasses.replace(moved, table=[{k: v for k, v in t.items() if not k.startswith("cost_")}
                                                          for t in moved.table])])
    assert "met_within_cost_error" not in check


@pytest.mark.parametrize("value", ["1", "-0.1", "1.5"])
def test_a_cost_error_out_of_range_is_a_one_line_error(tmp_path, capsys, value):
    results = tmp_path / "results"
    shutil.copytree(FIXTURE, results)
    assert sim_main(["compare", "--results", str(results), "--cost", f"constant:{COST}", "--no-charts",
                     "--cost-error", value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--cost-error must be from 0 to below 1" in err[0]


def test_ttfts_stages_are_compared_where_the_real_records_time_them(tmp_path, comparison):
    """The fixture's records given intake and first-pass times: the stage rows are the real
    stages by hand against the simulation's (10 ms passes from an idle replica: no intake, no
    queue, the pass); the fixture as committed (records from before they were timed) has none,
    and the targets are TTFT, TPOT and E2EL's alone either way."""
    results = tmp_path / "results"
    shutil.copytree(FIXTURE, results)
    (run_dir,) = [p for p in (results / "continuous").iterdir() if p.is_dir()]
    requests, _ = real_records()
    for r in requests:
        r["queued_s"] = r["arrival_s"] + 0.001
        r["scheduled_s"] = (r["queued_s"] + r["first_token_s"]) / 2
    with gzip.open(run_dir / "requests.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in requests)
    (timed,) = run_compare(results, f"constant:{COST}")
    table = {(t["metric"], t["stat"]): t for t in timed.table}
    queue = [r["scheduled_s"] - r["queued_s"] for r in requests]
    prefill = [r["first_token_s"] - r["scheduled_s"] for r in requests]
    assert table["intake", "mean"]["real_ms"] == pytest.approx(1.0) and table["intake", "mean"]["sim_ms"] == 0
    assert table["queue", "p90"]["real_ms"] == pytest.approx(percentile(queue, 90) * 1e3, rel=1e-9)
    assert table["queue", "p90"]["sim_ms"] == 0 and table["queue", "p90"]["error"] == -1
    assert table["prefill", "p50"]["real_ms"] == pytest.approx(percentile(prefill, 50) * 1e3, rel=1e-9)
    assert table["prefill", "p50"]["sim_ms"] == pytest.approx(COST * 1e3)
    assert not any(t["metric"] in ("intake", "queue", "prefill") for t in comparison.table)
    want = (COST * 1e3 - table["prefill", "mean"]["real_ms"])
    assert "intake -1.00 ms" in timed.diagnosis["verdict"] and f"prefill {want:+.2f} ms" in timed.diagnosis["verdict"]
    assert "by stage" not in comparison.diagnosis["verdict"]
    assert targets([timed]) == targets([comparison])


def test_worker_processes_make_the_same_comparisons_in_the_same_order(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(FIXTURE, results)
    store = results / "continuous"
    (row,) = [json.loads(line) for line in open(store / "runs.jsonl")]
    for k in range(2):  # two more runs of the fixture's records, under other ids
        again = dict(row, run_id=f"{row['run_id']}-again{k}")
        shutil.copytree(store / row["run_id"], store / again["run_id"])
        with open(store / "runs.jsonl", "a") as f:
            f.write(json.dumps(again) + "\n")
    one = run_compare(results, f"constant:{COST}", seeds=0, cost_error=0.02)
    two = run_compare(results, f"constant:{COST}", seeds=0, cost_error=0.02, jobs=2)
    assert [c.run_id for c in two] == [c.run_id for c in one] and len(one) == 3
    assert [c.table for c in two] == [c.table for c in one]
    assert [c.diagnosis["verdict"] for c in two] == [c.diagnosis["verdict"] for c in one]


def test_a_run_is_simulated_again_with_its_cards_offset_from_the_other_runs_on_it(tmp_path, capsys):
    """A second run of the fixture on the same card (its row's commit and time: the same device
    call), its passes 10% slower: the first is simulated again with every pass as much longer as
    the second's passes took over their price, and the second with the first's offset; a third on
    another card (a GPU UUID of its own) has no other run to take an offset from."""
    results = tmp_path / "results"
    shutil.copytree(FIXTURE, results)
    store = results / "continuous"
    (row,) = [json.loads(line) for line in open(store / "runs.jsonl")]
    _, passes = real_records()
    slower = [dict(p, duration_s=p["duration_s"] * 1.1) for p in passes]
    for suffix, records, uuid in (("-slower", slower, None), ("-elsewhere", passes, "GPU-other")):
        again = dict(row, run_id=row["run_id"] + suffix, gpu_uuid=uuid)
        shutil.copytree(store / row["run_id"], store / again["run_id"])
        with gzip.open(store / again["run_id"] / "passes.jsonl.gz", "wt") as f:
            f.writelines(json.dumps(p) + "\n" for p in records)
        with open(store / "runs.jsonl", "a") as f:
            f.write(json.dumps(again) + "\n")
    out = tmp_path / "validation"
    assert sim_main(["compare", "--results", str(results), "--cost", f"constant:{COST}", "--no-charts", "--seeds", "0",
                     "--cost-error", "0", "--out", str(out)]) == 0
    checks = {r["run_id"]: r for r in csv.DictReader(open(out / "targets.csv"))}
    own = sum(p["duration_s"] for p in passes) / (COST * len(passes))  # measured over priced, the fixture's passes
    first, second, third = (checks[row["run_id"] + s] for s in ("", "-slower", "-elsewhere"))
    assert float(first["card_offset"]) == pytest.approx(own * 1.1) and float(first["card_runs"]) == 1
    assert float(second["card_offset"]) == pytest.approx(own)
    assert third["card_offset"] == "" and third["card_met"] == ""
    # the first run simulated with passes of `own * 1.1` x 10 ms: as `calibrated...*factor` would
    (moved,) = run_compare(results, f"constant:{COST}", only=row["run_id"] + "-elsewhere", offsets={
        row["run_id"] + "-elsewhere": own * 1.1})
    (base,) = run_compare(results, f"constant:{COST * own * 1.1}", only=row["run_id"] + "-elsewhere")
    assert [t["sim_ms"] for t in moved.table] == pytest.approx([t["sim_ms"] for t in base.table])
    assert "of the 2 runs whose card served others" in capsys.readouterr().out


def test_latency_against_rate_draws_each_model_apart(comparison, tmp_path):
    """Two models' part0 runs at like rates are two lines, one panel row per model, not one line
    that zigzags between them."""
    from dataclasses import replace

    from sim.compare import charts
    runs = [replace(comparison, row=dict(comparison.row, run_id=f"seed-{model}-{rate}", workload="seed", rate=rate,
                                         model=model, replicas=1))
            for model in ("qwen2.5-1.5b", "llama-3.1-8b") for rate in (4.0, 10.0)]
    (tmp_path / "scratch").mkdir()
    assert charts(runs, tmp_path, tmp_path / "scratch")["latency-vs-rate"].exists()
    page = (tmp_path / "latency-vs-rate.html").read_text()
    assert '"row": {"field": "model"' in page
    # 2 rates x TTFT and TPOT at p50 and p99 x real and simulated, per model
    assert page.count('"model": "llama-3.1-8b"') == page.count('"model": "qwen2.5-1.5b"') == 16
