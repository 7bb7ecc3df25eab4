"""sim/card.py: which runs share a card, and each run's card offset taken from the others."""
import pytest

from core.records import PassRecord
from sim.card import SAME_CARD_GAP_S, card_offsets, cards, like_load, run_offset
from sim.cost import ConstantCost


def row(run_id, commit="abc1234", time="2026-11-30T16:00:00+00:00", uuid=None):
    return {"run_id": run_id, "model": "tiny", "git_commit": commit, "time": time, "gpu_uuid": uuid}


def passes(durations):
    return [PassRecord(run_id="r", engine="continuous", step=i, kind="decode", new_tokens=[1], context_lens=[10],
                       start_s=float(i), duration_s=d) for i, d in enumerate(durations)]


class Store:
    """A RunStore's `passes` from a dict."""
    def __init__(self, by_run):
        self.by_run = by_run

    def passes(self, run_id):
        return self.by_run[run_id]


def test_a_named_card_is_its_uuid_and_unnamed_runs_started_close_together_share_one():
    rows = [row("a", uuid="GPU-1"), row("b", uuid="GPU-1"), row("c", uuid="GPU-2"),
            row("d"), row("e", time="2026-11-30T16:10:00+00:00"),  # the same card: 10 minutes later
            row("f", time="2026-11-30T16:40:00+00:00"),  # 30 minutes after e: another card
            row("g", commit="def5678", time="2026-11-30T16:05:00+00:00")]  # another commit: another card
    card = dict(zip("abcdefg", cards(rows)))
    assert card["a"] == card["b"] == "GPU-1" and card["c"] == "GPU-2"
    assert card["d"] == card["e"] and len({card["d"], card["f"], card["g"], "GPU-1", "GPU-2"}) == 5
    assert SAME_CARD_GAP_S < 30 * 60


def test_a_runs_offset_is_its_measured_over_priced_pass_time():
    assert run_offset(ConstantCost(0.01), passes([0.011, 0.012, 0.010])) == pytest.approx(0.033 / 0.030)
    with pytest.raises(ValueError, match="no passes"):
        run_offset(ConstantCost(0.01), [])


def test_each_run_takes_the_mean_offset_of_the_other_runs_on_its_card():
    store = Store({"a": passes([0.010] * 4), "b": passes([0.011] * 4), "c": passes([0.012] * 4),
                   "alone": passes([0.02] * 4)})
    runs = [(row("a", uuid="GPU-1"), store), (row("b", uuid="GPU-1"), store), (row("c", uuid="GPU-1"), store),
            (row("alone", uuid="GPU-2"), store)]
    found = card_offsets(runs, lambda model: ConstantCost(0.01))
    assert found[0] == (pytest.approx(1.15), 2)  # b's 1.1 and c's 1.2, never a's own 1.0
    assert found[1] == (pytest.approx(1.1), 2) and found[2] == (pytest.approx(1.05), 2)
    assert 3 not in found  # no other run on its card: no offset


def test_a_runs_offset_comes_from_runs_of_a_like_load_only():
    def served(run_id, rate, workload="seed", replicas=1):
        return dict(row(run_id, uuid="GPU-1"), workload=workload, rate=rate, replicas=replicas)
    assert like_load(served("a", 30), served("b", 60)) and like_load(served("a", 60), served("b", 30))
    assert not like_load(served("a", 7), served("b", 60))  # beyond LOAD_RATIO
    assert not like_load(served("a", 60), served("b", 60, workload="azure"))
    assert not like_load(served("a", 60), served("b", 60, replicas=2))
    window = [dict(row(k, uuid="GPU-1"), workload="azure", rate=None, rate_scale=scale)
              for k, scale in (("w8", 8), ("w11", 11))]
    assert like_load(*window)
    store = Store({"light": passes([0.010] * 4), "near": passes([0.011] * 4), "far": passes([0.020] * 4)})
    runs = [(served("light", 30), store), (served("near", 60), store), (served("far", 480), store)]
    found = card_offsets(runs, lambda model: ConstantCost(0.01))
    assert found[0] == (pytest.approx(1.1), 1)  # the run at 60 req/s, not the one at 480
    assert found[1] == (pytest.approx(1.0), 1) and 2 not in found


def test_the_cli_prints_each_runs_offset_their_mean_and_the_cost_to_simulate_the_card_with(tmp_path, capsys):
    import gzip
    import json
    import shutil
    from pathlib import Path

    from sim.__main__ import main as sim_main
    fixture = Path(__file__).parent / "fixtures" / "compare-tiny"
    results = tmp_path / "results"
    shutil.copytree(fixture, results)
    (row,) = [json.loads(line) for line in open(results / "continuous" / "runs.jsonl")]
    (run_dir,) = [p for p in (results / "continuous").iterdir() if p.is_dir()]
    with gzip.open(run_dir / "passes.jsonl.gz", "rt") as f:
        durations = [json.loads(line)["duration_s"] for line in f]
    offset = sum(durations) / (0.01 * len(durations))
    assert sim_main(["card-offset", row["run_id"], "--results", str(results), "--cost", "constant:0.01"]) == 0
    out = capsys.readouterr().out
    assert f"{offset - 1:+.2%}" in out and f"--cost 'constant:0.01*{offset:.4f}'" in out
    assert sim_main(["card-offset", "no-such-run", "--results", str(results), "--cost", "constant:0.01"]) == 2
    assert "no run no-such-run" in capsys.readouterr().err
    assert sim_main(["card-offset", "--card", "GPU-none", "--results", str(results)]) == 2
    assert "no runs under" in capsys.readouterr().err
    assert sim_main(["card-offset", "--results", str(results)]) == 2
    assert "name the runs" in capsys.readouterr().err
