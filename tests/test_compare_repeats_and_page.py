"""`sim compare`'s folders of runs measured again (--repeats), the card offsets reading only the pass
logs they need, and the report page escaping every text it embeds."""
import csv
import json
import shutil
from pathlib import Path

import pytest

from sim.__main__ import main as sim_main
from sim.card import card_offsets
from sim.compare import report_page, run_compare, targets
from sim.cost import ConstantCost
from tests.test_card import passes, row

FIXTURE = Path(__file__).parent / "fixtures" / "compare-tiny"
COST = "constant:0.01"


class OnlyStore:
    """A store whose `passes` fails for runs not in `by_run` (their pass logs are not there)."""
    def __init__(self, by_run):
        self.by_run, self.read = by_run, []

    def passes(self, run_id):
        self.read.append(run_id)
        return self.by_run[run_id]


def test_card_offsets_for_the_first_runs_read_only_the_pass_logs_that_give_one():
    store = OnlyStore({"b": passes([0.011] * 4)})
    runs = [(row("a", uuid="GPU-1"), store), (row("b", uuid="GPU-1"), store), (row("lonely", uuid="GPU-2"), store)]
    found = card_offsets(runs, lambda model: ConstantCost(0.01), first=1)
    assert found == {0: (pytest.approx(1.1), 1)}
    assert store.read == ["b"]  # neither a's own log nor the lone card's


def repeated(tmp_path: Path, folder: str) -> Path:
    """The fixture with its run measured again (10% slower at every statistic) in RESULTS/FOLDER."""
    results = tmp_path / "results"
    shutil.copytree(FIXTURE, results)
    (again,) = [json.loads(line) for line in open(results / "continuous" / "runs.jsonl")]
    again = again | {k: v * 1.1 for k, v in again.items() if k.endswith("_ms") and isinstance(v, float)}
    (results / folder).mkdir()
    (results / folder / "runs.jsonl").write_text(json.dumps(again) + "\n")
    return results


def test_compare_reads_the_repeats_from_the_folders_named(tmp_path):
    results = repeated(tmp_path, "again-elsewhere")
    out = tmp_path / "default"
    assert sim_main(["compare", "--results", str(results), "--cost", COST, "--no-charts", "--no-card-offset",
                     "--seeds", "0", "--out", str(out)]) == 0
    assert [r["repeats"] for r in csv.DictReader(open(out / "targets.csv"))] == ["0"]
    named = tmp_path / "named"
    assert sim_main(["compare", "--results", str(results), "--cost", COST, "--no-charts", "--no-card-offset",
                     "--seeds", "0", "--out", str(named), "--repeats", "again-elsewhere"]) == 0
    (check,) = csv.DictReader(open(named / "targets.csv"))
    assert check["repeats"] == "1" and float(check["repeat_worst_p50_p90"]) == pytest.approx(0.1)


def test_the_report_page_escapes_the_cost_and_the_run_ids():
    (c,) = run_compare(FIXTURE, COST)
    c.row = dict(c.row, run_id="<script>alert(1)</script>")
    page = report_page([c], targets([c]), {}, "constant:0.01 <b>&</b>")
    assert "<script>" not in page and "<b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;b&gt;&amp;&lt;/b&gt;" in page
