"""benchmarks/trust_table.py: the validation's targets by kind of run, one model's runs."""
import json

from benchmarks.trust_table import main


def test_the_table_counts_only_the_models_runs(tmp_path, capsys):
    (tmp_path / "continuous").mkdir()
    (tmp_path / "validation").mkdir()
    rows = [{"run_id": "seed-a", "rate": 5.0, "requests": 50},  # before rows named their model: the 1.5B's
            {"run_id": "seed-b", "rate": 4.0, "requests": 33, "model": "llama-3.1-8b"},
            {"run_id": "seed-c", "rate": 10.0, "requests": 98, "model": "llama-3.1-8b"}]
    (tmp_path / "continuous" / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "validation" / "targets.csv").write_text(
        "run_id,saturated,met,met_within_cost_error\nseed-a,False,True,True\nseed-b,False,False,True\n"
        "seed-c,False,True,True\n")
    assert main(["--results", str(tmp_path)]) == 0
    light = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| one replica, light load (1-60")]
    assert light == ["| one replica, light load (1-60 req/s), 50 or 150 requests | 1 | 1 of 1 | - | 1 of 1 | - |"]
