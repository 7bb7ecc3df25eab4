"""The engine's scatter in the simulator (sim/noise.py): seeded draws around the calibrated
medians, `--noise` on a run, and `sim compare --seeds` taking the median of scattered runs."""
import numpy as np
import pytest

from core.scheduler import ScheduledPass, Sequence
from sim.cost import ConstantCost
from sim.host import HostTime
from sim.noise import Noise, NoisyCost, robust_sigma


class Noisy(ConstantCost):
    """A constant pass time with a host and a measured scatter, as a calibration file gives them."""

    def __init__(self, seconds, noise, host=None):
        super().__init__(seconds)
        self.noise, self.host = noise, host


def plan_of(new_tokens):
    seqs = [Sequence(f"s{i}", 0.0, n, 1) for i, n in enumerate(new_tokens)]
    return ScheduledPass(seqs, list(new_tokens), [0] * len(new_tokens), decode=all(n == 1 for n in new_tokens))


def test_pass_times_scatter_around_the_calibrated_one_as_measured():
    cost = NoisyCost(ConstantCost(0.002), Noise(pass_sigma=0.01), seed=3)
    times = [cost.pass_time([1], [100]) for _ in range(4000)]
    assert np.median(times) == pytest.approx(0.002, rel=0.002)
    assert robust_sigma(times) == pytest.approx(0.01, rel=0.06)
    again = NoisyCost(ConstantCost(0.002), Noise(pass_sigma=0.01), seed=3)
    assert [again.pass_time([1], [100]) for _ in range(4000)] == times  # seeded
    other = NoisyCost(ConstantCost(0.002), Noise(pass_sigma=0.01), seed=4)
    assert [other.pass_time([1], [100]) for _ in range(10)] != times[:10]
    a, b, valid = NoisyCost(ConstantCost(0.002), Noise(pass_sigma=0.01), seed=3).decode_line(8, 800, 100)
    assert b == 0.0 and a != 0.002 and valid > 0  # a fast-forwarded run scatters as one


def test_host_terms_scatter_each_with_its_own_sigma():
    host = HostTime(fixed_s=0.0006, wake_s=0.0004, retire_s=7e-5, launch_s=0.0004, eager_launch_s=0.014, graph_tokens=8192)
    noise = Noise(idle_sigma=0.3, launch_sigma=0.4, eager_launch_sigma=0.0)
    cost = NoisyCost(Noisy(0.002, noise, host), noise, seed=0)
    idle = [cost.host.idle_delay(plan_of([100]), woke=True) for _ in range(3000)]
    assert np.median(idle) == pytest.approx(0.001, rel=0.05) and robust_sigma(idle) == pytest.approx(0.3, rel=0.1)
    launches = [cost.host.launch_time(plan_of([100])) for _ in range(3000)]
    assert robust_sigma(launches) == pytest.approx(0.4, rel=0.1)
    assert robust_sigma([cost.host.retire_s for _ in range(3000)]) == pytest.approx(0.4, rel=0.1)
    assert cost.host.launch_time(plan_of([9000])) == 0.014  # eager launches: sigma 0 here


def test_robust_sigma_is_not_swayed_by_an_outlier():
    rng = np.random.default_rng(0)
    samples = list(np.exp(0.2 * rng.standard_normal(2000))) + [1e6]
    assert robust_sigma(samples) == pytest.approx(0.2, rel=0.08)
    assert robust_sigma([1.0]) == 0.0


@pytest.mark.parametrize("bad", [{"pass_sigma": -0.1}, {"launch_sigma": 3.0}, {"idle": 0.1}, [0.1]])
def test_bad_noise_fields_are_named(bad):
    with pytest.raises(ValueError, match="noise"):
        Noise.from_dict(bad)


def test_noise_on_a_run_is_seeded_and_refused_without_a_measured_scatter(tmp_path, capsys):
    from sim.__main__ import main
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{i * 0.01},{64 + i},{20}\n" for i in range(40)))
    assert main(["run", "--trace", str(trace), "--policy", "continuous", "--cost", "roofline:h200", "--noise"]) == 2
    assert "--noise" in capsys.readouterr().err


def test_compare_takes_the_median_of_scattered_runs():
    from pathlib import Path

    from core.runstore import RunStore
    from sim.compare import compare, compute_metrics, simulate_like, stats
    fixture = Path(__file__).parent / "fixtures" / "compare-tiny"
    store = RunStore(fixture / "continuous")
    (row,) = store.rows()
    cost = Noisy(0.01, Noise(pass_sigma=0.05))
    real = store.requests(row["run_id"])
    each = [stats(compute_metrics(simulate_like(row, real, cost, seed=i).table)) for i in range(3)]
    assert len({e["e2el"]["p50"] for e in each}) == 3  # the seeds differ
    c = compare(row, store, cost, cost, seeds=3)
    table = {(t["metric"], t["stat"]): t for t in c.table}
    values = [e["e2el"]["p90"] * 1e3 for e in each]
    assert table["e2el", "p90"]["sim_ms"] == pytest.approx(float(np.median(values)))
    assert (table["e2el", "p90"]["sim_lo_ms"], table["e2el", "p90"]["sim_hi_ms"]) == pytest.approx((min(values), max(values)))
    plain = compare(row, store, ConstantCost(0.01), ConstantCost(0.01), seeds=3)  # no scatter measured: one run
    assert all(t["sim_lo_ms"] == t["sim_hi_ms"] for t in plain.table if "sim_lo_ms" in t)
