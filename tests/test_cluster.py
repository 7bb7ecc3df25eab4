"""Two tiny-model replicas, one process each, behind the shared router, on the CPU."""
import pytest

pytest.importorskip("torch", reason="the engine's tests need the engine extra (torch)")

from core.records import read_jsonl  # noqa: E402
from engine.serve import main  # noqa: E402


def test_two_replicas_behind_the_router_serve_every_request(tmp_path, capsys):
    assert main(["--rates", "40", "--requests", "10", "--output-tokens", "4",
                 "--replicas", "2", "--router", "round-robin", "--out", str(tmp_path), "--name", "two"]) == 0
    row, = read_jsonl(tmp_path / "continuous" / "runs.jsonl")
    assert row["status"] == "ok" and row["replicas"] == 2 and row["router"] == "round-robin"
    assert row["completed"] == 10 and row["requests_per_replica"] == [5, 5]
    run = tmp_path / "continuous" / row["run_id"]
    requests = list(read_jsonl(run / "requests.jsonl.gz"))
    passes = list(read_jsonl(run / "passes.jsonl.gz"))
    assert sorted(r["replica"] for r in requests) == [0] * 5 + [1] * 5  # each record names its replica
    assert {p["replica"] for p in passes} == {0, 1} and not list(run.glob("replica*"))
    for replica in (0, 1):  # each replica's own passes account for its own requests' tokens
        mine = [r for r in requests if r["replica"] == replica]
        assert sum(sum(p["new_tokens"]) for p in passes if p["replica"] == replica) == \
            sum(r["prompt_tokens"] + r["output_tokens"] - 1 for r in mine)
    for r in requests:  # one clock: token times after arrival, in order
        assert r["token_times_s"][0] > r["arrival_s"] and r["token_times_s"] == sorted(r["token_times_s"])
        # taken in by its replica after the router's hand-over, first pass after that
        assert r["arrival_s"] <= r["queued_s"] <= r["scheduled_s"] < r["token_times_s"][0]
    assert row["mean_intake_ms"] >= 0 and row["mean_queue_ms"] >= 0 and row["mean_prefill_ms"] > 0
    assert f"prefill {row['median_prefill_ms']:.1f} ms" in capsys.readouterr().out  # the run's summary line


def test_cpu_shares_are_disjoint_and_leave_the_router_a_core():
    from engine.cluster import cpu_shares
    router, replicas = cpu_shares(list(range(32)), 2)
    assert router == [0] and replicas == [list(range(1, 16)), list(range(16, 31))]
    assert not set(router) & set(replicas[0]) and not set(replicas[0]) & set(replicas[1])
    router, replicas = cpu_shares([0, 1, 2, 3], 2)  # fewer than two cores a process: all share
    assert router == [0, 1, 2, 3] and replicas == [[0, 1, 2, 3]] * 2
