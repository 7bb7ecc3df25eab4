"""Recent prompt work slowing the next decode passes (sim/heat.py), by hand-computed cases."""
import math

import pytest

from core.kv import BlockPool
from core.records import PassRecord
from core.scheduler import ContinuousBatching
from sim.cost import ConstantCost
from sim.heat import Heat, HeatState, factors
from sim.run import simulate
from tests.sim_helpers import trace_of


def test_the_integrator_fills_during_prefill_and_leaks_after():
    s = HeatState(Heat(decode=0.1, prefill=0.3, tau_s=0.01))
    assert s.factor(0.0) == 1.0
    s.passed(0.0, 0.01, u=1.0)  # H = tau (1 - e^-1)
    assert math.isclose(s.factor(0.01), 1 + 0.1 * (1 - math.exp(-1)))
    assert math.isclose(s.factor(0.02), 1 + 0.1 * (1 - math.exp(-1)) * math.exp(-1))
    s.passed(0.02, 0.005, u=0.0)  # decode passes only let it cool
    assert math.isclose(s.factor(0.025), 1 + 0.1 * (1 - math.exp(-1)) * math.exp(-1.5))
    assert math.isclose(s.factor(0.025, u=1.0), 1 + 0.3 * (1 - math.exp(-1)) * math.exp(-1.5))
    long = HeatState(Heat(decode=0.1, tau_s=0.01))
    long.passed(0.0, 1.0, u=1.0)
    assert math.isclose(long.factor(1.0), 1.1)  # saturated


def test_factors_of_a_logged_stream():
    # a decode, a prompt (heats), a decode, a mixed pass (counts as decode: does not heat), a prompt;
    # each pass's factor is 1 + kappa * the mean of h over its own logged time
    passes = [PassRecord.make("r", "e", i, n, [0] * len(n), t, d) for i, (n, t, d) in
              enumerate([([1], 0.0, 0.001), ([100], 0.001, 0.01), ([1], 0.011, 0.002), ([1, 30], 0.013, 0.002),
                         ([50], 0.015, 0.001)])]
    f = factors(passes, Heat(decode=0.2, prefill=0.5, tau_s=0.01))
    e = math.exp
    assert f[0] == 1.0
    assert math.isclose(f[1], 1 + 0.5 * e(-1))  # from rest for one tau: mean h = 1 - (1 - e^-1) = e^-1
    h = 1 - e(-1)  # after it
    cool = 0.01 / 0.002 * (1 - e(-0.2))  # the mean of e^(-t/tau) over 2 ms
    assert math.isclose(f[2], 1 + 0.2 * h * cool)
    assert math.isclose(f[3], 1 + 0.2 * h * e(-0.2) * cool)
    assert math.isclose(f[4], 1 + 0.5 * (1 + (h * e(-0.4) - 1) * 10 * (1 - e(-0.1))))


def test_the_level_rises_and_falls_at_their_own_rates():
    heat = Heat(decode=0.1, prefill=0.2, tau_s=0.01, tau_up_s=0.04)
    s = HeatState(heat)
    s.passed(0.0, 0.04, u=1.0)  # one tau_up of prompt work
    assert math.isclose(s.value(0.04), 1 - math.exp(-1))
    assert math.isclose(s.value(0.05), (1 - math.exp(-1)) * math.exp(-1))  # one tau_s idle
    # a 40 ms prompt pass from rest: the mean of h over it is 1 - (1 - e^-1) = e^-1
    assert math.isclose(HeatState(heat).factor(0.0, 1.0, 0.04), 1 + 0.2 * math.exp(-1))
    assert Heat(tau_s=0.01).rise_s == 0.01 and Heat(tau_s=0.01, tau_up_s=0.03).rise_s == 0.03
    assert Heat.from_dict({"decode": 0.1, "prefill": 0.1, "tau_s": 0.05}).rise_s == 0.05  # older files


def test_a_pass_loads_the_card_by_its_tokens():
    heat = Heat(decode=0.08, prefill=0.12, tau_s=0.03, tau_up_s=0.08, full_tokens=2048)
    assert heat.load([512]) == 0.25 and heat.load([1] * 64 + [2048]) == 1.0 and heat.load([1] * 1024) == 0.0
    assert heat.kappa(0.25) == pytest.approx(0.08 + 0.04 * 0.25)
    s = HeatState(heat)
    for i in range(400):  # 512-token passes of 3 ms back to back (15 tau_up): h settles at their load
        s.passed(i * 0.003, 0.003, 0.25)
    assert s.value(1.2) == pytest.approx(0.25, rel=1e-3)
    assert s.factor(1.2, 0.25, 0.003) == pytest.approx(1 + heat.kappa(0.25) * 0.25, rel=1e-3)
    s.passed(1.2, 0.003, 0.0)  # a lighter pass: h falls towards 0 with tau_s
    assert s.value(1.203) == pytest.approx(0.25 * math.exp(-0.1), rel=1e-3)
    # older files: prompt passes load fully, the others not at all
    old = Heat(decode=0.1, prefill=0.1, tau_s=0.05)
    assert old.load([100, 3]) == 1.0 and old.load([100, 1]) == 0.0


def test_decodes_beside_prompt_tokens_dilute_a_pass_load():
    # each decode beside a chunk counts as decode_weight tokens that draw no heat: a chunk of 2,048
    # beside 256 decodes loads the card 2048 / (2048 + 4 * 256) = 2/3, beside 64 decodes 8/9
    heat = Heat(decode=0.08, prefill=0.12, tau_s=0.04, tau_up_s=0.06, full_tokens=1024, decode_weight=4.0)
    assert heat.load([1] * 256 + [2048]) == pytest.approx(2 / 3)
    assert heat.load([1] * 64 + [2048]) == pytest.approx(8 / 9)
    assert heat.load([512, 1, 1]) == pytest.approx(0.5 * 512 / 520)  # the share of full load, diluted
    assert heat.load([2048]) == 1.0 and heat.load([1] * 256) == 0.0
    assert Heat.from_dict(heat.as_dict()) == heat
    assert Heat.from_dict({k: v for k, v in heat.as_dict().items() if k != "decode_weight"}).load([1] * 64 + [2048]) == 1.0
    with pytest.raises(ValueError, match="decode_weight"):
        Heat.from_dict(heat.as_dict() | {"decode_weight": -1.0})


def prompt_then_decode(rested, heat):
    """By hand: a prompt pass from rest, then a decode pass right after it, each solved for its own
    length (mean of h over the pass) by two substitutions, as the simulator does."""
    tau = heat.tau_s
    d0 = rested
    for _ in range(2):
        d0 = rested * (1 + heat.prefill * (1 - tau / d0 * (1 - math.exp(-d0 / tau))))
    h = 1 - math.exp(-d0 / tau)
    d1 = rested
    for _ in range(2):
        d1 = rested * (1 + heat.decode * h * tau / d1 * (1 - math.exp(-d1 / tau)))
    return d0, d1


class Heated(ConstantCost):
    def __init__(self, seconds, heat):
        super().__init__(seconds)
        self.heat = heat


def test_decode_passes_after_a_prompt_run_slower_then_recover():
    # one request: a 10 ms prefill pass, then decode passes of 10 ms rested; kappa 0.5, tau 10 ms
    heat = Heat(decode=0.5, prefill=0.2, tau_s=0.01)
    sched = lambda: ContinuousBatching(BlockPool(100, 16), max_num_seqs=4, max_model_len=512)  # noqa: E731
    r = simulate(trace_of([(0.0, 100, 4)]), sched, Heated(0.01, heat), keep_token_times=True, log_passes=True,
                 fast_forward=False)
    d = [p.duration_s for p in r.passes]
    d0, d1 = prompt_then_decode(0.01, heat)
    assert math.isclose(d[0], d0) and d0 > 0.01  # the prompt heats the card while it runs
    assert math.isclose(d[1], d1) and d1 > 0.01
    assert 0.01 < d[2] < d[1] and d[3] < d[2]  # recovering
    rested = simulate(trace_of([(0.0, 100, 4)]), sched, ConstantCost(0.01), keep_token_times=True, log_passes=True)
    assert all(math.isclose(p.duration_s, 0.01) for p in rested.passes)
    # fast-forwarded, the run of decode passes takes their mean factor: the same end within 1%
    ff = simulate(trace_of([(0.0, 100, 40)]), sched, Heated(0.01, heat), fast_forward=True)
    step = simulate(trace_of([(0.0, 100, 40)]), sched, Heated(0.01, heat), fast_forward=False)
    assert ff.num_steps < step.num_steps
    assert ff.requests[0].finish_s == pytest.approx(step.requests[0].finish_s, rel=0.01)


@pytest.mark.parametrize("bad", [{"decode": -0.1, "tau_s": 0.01}, {"prefill": 0.1, "tau_s": 0.0},
                                 {"decode": 2.0, "tau_s": 0.01}, {"decode": 0.1}, {"tau": 0.01}, [0.1, 0.01]])
def test_bad_heat_fields_are_named(bad):
    with pytest.raises(ValueError, match="heat"):
        Heat.from_dict(bad)


def test_the_fit_recovers_a_known_heat_from_a_pass_stream():
    """Decode passes of 2 ms and prompt passes of 1-40 ms in a shuffled order, timed as a known
    heat (decode +8%, prefill +6%, tau 50 ms) on a model that predicts the rested times."""
    import numpy as np

    from calibrate.heat import fit_heat
    rng = np.random.default_rng(3)
    truth = Heat(decode=0.08, prefill=0.06, tau_s=0.05)
    state, passes, rested, t = HeatState(truth), [], [], 0.0
    for i in range(3000):
        prompt = rng.random() < 0.2
        base = float(rng.uniform(0.001, 0.04)) if prompt else 0.002
        d = state.slowed(t, base, prompt)
        passes.append(PassRecord.make("r", "e", i, [int(rng.integers(2, 900))] if prompt else [1, 1], [0, 0][:1 if prompt
                                      else 2], t, d))
        rested.append(base)
        state.passed(t, d, prompt)
        t += d + (0.3 if rng.random() < 0.01 else 0.0)  # now and then a rest
    heat, scale = fit_heat(passes, rested)
    assert heat.tau_s == 0.05
    assert abs(heat.decode - 0.08) < 0.004 and abs(heat.prefill - 0.06) < 0.004
    assert abs(scale["decode"] - 1) < 0.002 and abs(scale["prefill"] - 1) < 0.002


def test_mixed_passes_slow_by_their_own_kappa_where_one_is_given():
    heat = Heat(decode=0.06, prefill=0.17, tau_s=0.04, tau_up_s=0.05, full_tokens=1024, decode_weight=8.0, mixed=0.05)
    assert heat.kappa_of([1] * 64 + [2048], [100] * 64 + [0]) == 0.05  # a chunk beside decodes
    assert heat.kappa_of([2048, 512], [0, 0]) == pytest.approx(0.17)  # prompts only: kappa of its load, 1
    assert heat.kappa_of([256], [0]) == pytest.approx(0.06 + 0.11 * 0.25)
    assert heat.kappa_of([1] * 8, [100] * 8) == pytest.approx(0.06)
    assert Heat.from_dict(heat.as_dict()) == heat
    older = Heat(decode=0.06, prefill=0.17, tau_s=0.04, tau_up_s=0.05, full_tokens=1024, decode_weight=8.0)
    assert "mixed" not in older.as_dict()  # files without it keep kappa(u) for mixed passes
    chunk = ([1] * 64 + [2048], [100] * 64 + [0])
    assert older.kappa_of(*chunk) == pytest.approx(older.kappa(older.load(chunk[0])))
    # a simulated run prices its mixed passes by it: the same prompt work heats alike, the
    # mixed pass after it slows by `mixed` at the level, not by kappa of its load
    passes = [PassRecord.make("r", "e", 0, [4096], [0], 0.0, 0.1),
              PassRecord.make("r", "e", 1, [1] * 64 + [2048], [100] * 64 + [0], 0.1, 0.01)]
    level = HeatState(heat)
    level.passed(0.0, 0.1, 1.0)
    h = level.mean(0.1, 0.01, heat.load(passes[1].new_tokens))
    assert factors(passes, heat)[1] == pytest.approx(1 + 0.05 * h)
    assert factors(passes, older)[1] == pytest.approx(1 + older.kappa(older.load(passes[1].new_tokens)) * h)
    with pytest.raises(ValueError, match="heat.mixed"):
        Heat.from_dict({"decode": 0.1, "prefill": 0.1, "tau_s": 0.05, "mixed": 1.5})


def test_the_serving_fit_recovers_known_slow_downs_from_open_runs():
    """Open runs' pass logs timed by a known heat (decode 6%, prompts 17%, mixed passes 5%) and a
    little noise; the fit starts from other slow-downs at the same time constants and loads."""
    import numpy as np

    from calibrate.heat import fit_serving

    class Shapes:  # a cost model that knows each shape's rested time
        def __init__(self):
            self.rested = {}

        def pass_time(self, new_tokens, context_lens):
            return self.rested[tuple(new_tokens), tuple(context_lens)]

    dynamics = dict(tau_s=0.04, tau_up_s=0.05, full_tokens=1024, decode_weight=8.0)
    truth = Heat(decode=0.06, prefill=0.17, mixed=0.05, **dynamics)
    cost, runs, rng = Shapes(), [], np.random.default_rng(5)
    for run in range(2):
        state, passes, t = HeatState(truth), [], 0.0
        for i in range(3000):
            kind = rng.choice(["decode", "prefill", "mixed"], p=[0.6, 0.2, 0.2])
            batch = int(rng.integers(1, 200))
            prompt = int(rng.integers(16, 4096))
            new = {"decode": [1] * batch, "prefill": [prompt], "mixed": [1] * batch + [prompt]}[kind]
            ctx = [int(rng.integers(1, 2000)) for _ in new]
            base = 0.002 + 3e-6 * sum(new)
            cost.rested[tuple(new), tuple(ctx)] = base
            d = state.slowed(t, base, truth.load(new), truth.kappa_of(new, ctx)) * (1 + 0.002 * rng.standard_normal())
            passes.append(PassRecord.make(f"r{run}", "e", i, new, ctx, t, d))
            state.passed(t, d, truth.load(new))
            t += d + (0.2 if rng.random() < 0.02 else 0.0)
        runs.append(passes)
    fitted, basis = fit_serving(runs, cost, Heat(decode=0.08, prefill=0.12, **dynamics))
    assert fitted.decode == pytest.approx(0.06, abs=0.003) and fitted.prefill == pytest.approx(0.17, abs=0.003)
    assert fitted.mixed == pytest.approx(0.05, abs=0.003)
    assert (fitted.tau_s, fitted.rise_s, fitted.full_tokens, fitted.decode_weight) == (0.04, 0.05, 1024, 8.0)
    assert basis["runs"] == 2 and basis["passes"] == 6000
    assert basis["before"]["mixed"] > 0.005 and basis["before"]["prefill"] < -0.005  # the start's prices miss
    assert all(abs(v) < 0.001 for v in basis["after"].values())
    with pytest.raises(ValueError, match="no mixed passes"):
        fit_serving([[p for p in runs[0] if p.kind != "mixed"]], cost, truth)
