"""The heat model measured by design (`python -m calibrate heat`, calibrate/response.py) and
fitted on it (`calibrate.heat.fit_response`), then used by `calibrate fit`."""
import json

import numpy as np
import pytest

pytest.importorskip("torch", reason="calibrate sits above the engine (its heat run's shapes are the engine sweep's)")

from calibrate.heat import fit_response, rested_references  # noqa: E402
from calibrate.response import CPU_SHAPES, segments  # noqa: E402
from core.records import PassRecord, pass_kind  # noqa: E402
from sim.heat import Heat, HeatState  # noqa: E402

RESTED = {"probe b64 c512": 0.002, "prompt n4096": 0.02, "prompts 16x4096": 0.3, "mixed n2048 b64": 0.018,
          "prompt n2048": 0.01, "prompt n512": 0.0035, "decode b16 c512": 0.0018, "decode b256 c1024": 0.0035,
          "decode b512 c2048": 0.007, "mixed n2048 b256": 0.025, "decode b256 c1000": 0.0045}


def designed_run(truth: Heat, noise: float = 0.002, step_at: int | None = None, seed: int = 0):
    """The heat run's sequences timed by a known heat model (and noise); from sequence `step_at` on,
    every pass 5% faster (a GPU whose speed steps between sequences)."""
    rng = np.random.default_rng(seed)
    state, passes, marks, t = HeatState(truth), [], [], 0.0
    for rep in range(1):
        for index, (name, seq) in enumerate(segments(0.35)):
            t += 1.5  # the rest
            first = len(passes)
            speed = 0.95 if step_at is not None and rep * 100 + index >= step_at else 1.0
            for shape in seq:
                new, ctx = [n for _, n in shape.seqs], [c for c, _ in shape.seqs]
                u = truth.load(new)
                d = state.slowed(t, RESTED[shape.group] * speed, u) * (1 + noise * rng.standard_normal())
                passes.append(PassRecord("heat-x", "continuous", len(passes), pass_kind(new, ctx), new, ctx, t, d))
                state.passed(t, d, u)
                t += d + 1e-5
            marks.append({"segment": name, "repeat": rep, "t0_s": 0.0, "first": first, "last": len(passes) - 1})
    return passes, marks


@pytest.mark.parametrize("step_at", [None, 4])  # 4: from the fifth sequence on
def test_the_fit_recovers_a_known_heat_from_a_designed_run(step_at):
    truth = Heat(decode=0.10, prefill=0.15, tau_s=0.04, tau_up_s=0.06, full_tokens=2048)
    heat, errors = fit_response(*designed_run(truth, step_at=step_at))
    assert (heat.tau_s, heat.tau_up_s, heat.full_tokens) == (0.04, 0.06, 2048)
    assert heat.decode == pytest.approx(0.10, abs=0.005) and heat.prefill == pytest.approx(0.15, abs=0.01)
    assert errors["decode"] < 0.005 and errors["prefill"] < 0.01
    # the serving sequence is left out of the fit and priced by it: within the noise and the references' own heat
    assert abs(errors["checked decode"]) < 0.01 and abs(errors["checked prefill"]) < 0.02


def test_the_fit_finds_how_much_decodes_dilute_a_mixed_pass_load():
    # the heat run's mixed passes beside 64 and beside 256 decodes tell the weight apart
    truth = Heat(decode=0.10, prefill=0.15, tau_s=0.04, tau_up_s=0.06, full_tokens=2048, decode_weight=4.0)
    heat, errors = fit_response(*designed_run(truth))
    assert heat.decode_weight == 4.0 and (heat.tau_s, heat.tau_up_s, heat.full_tokens) == (0.04, 0.06, 2048)
    assert heat.prefill == pytest.approx(0.15, abs=0.01) and errors["prefill"] < 0.01


def test_rested_references_are_per_sequence_and_quiet():
    p = lambda i, new, t, d: PassRecord("h", "continuous", i, pass_kind(new, [0] * len(new)), new, [0] * len(new), t, d)  # noqa: E731
    passes = [p(0, [1, 1], 0.0, 0.002), p(1, [100], 0.01, 0.02), p(2, [1, 1], 0.03, 0.004),  # the second: just after a prompt
              p(3, [1, 1], 0.5, 0.003),  # quiet again
              p(4, [100], 5.0, 0.03), p(5, [1, 1], 5.04, 0.005)]  # a sequence with no quiet probe: the overall median
    marks = [{"first": 0, "last": 3}, {"first": 4, "last": 5}]
    refs = rested_references(passes, marks)
    assert refs[2] == pytest.approx(0.0025) and refs[0] == pytest.approx(0.0025)  # median of 2 ms and 3 ms
    assert refs[1] == pytest.approx(0.02) and refs[4] == pytest.approx(0.03)  # each sequence's first prompt
    assert refs[5] == pytest.approx(0.0025)
    with pytest.raises(ValueError, match="no rested pass"):
        rested_references([p(0, [100], 0.0, 0.02), p(1, [1, 1, 1], 0.021, 0.002)], [{"first": 0, "last": 1}])


def test_fit_takes_the_heat_from_a_heat_run(tmp_path, capsys, user_calibrations):
    pytest.importorskip("torch", reason="calibrate sits above the engine")
    from calibrate.__main__ import main
    from core.runstore import RunStore
    from tests.test_calibrate import synthetic_passes, write_sweep
    store = write_sweep(tmp_path, synthetic_passes(noise=0.005))
    passes, marks = designed_run(Heat(decode=0.10, prefill=0.15, tau_s=0.04, tau_up_s=0.06))
    store.write_run("heat-x", passes, [], {"run_id": "heat-x", "engine": "continuous", "kind": "heat",
                                           "model": "qwen2.5-1.5b", "gpu": "NVIDIA H200", "segments": marks})
    assert main(["fit", "--results", str(tmp_path), "--name", "h200", "--no-charts"]) == 0
    assert "fitted on heat run heat-x" in capsys.readouterr().out
    doc = json.loads((user_calibrations / "qwen2.5-1.5b" / "h200.json").read_text())
    assert doc["heat_fitted_on"] == "heat-x"
    assert doc["heat"] == fit_response(passes, marks)[0].as_dict() == doc["held_out_heat"]


def test_a_heat_run_on_the_cpu_records_its_sequences(tmp_path):
    pytest.importorskip("torch", reason="the heat run runs the engine")
    from calibrate.__main__ import main
    from core.runstore import RunStore
    assert main(["heat", "--device", "cpu", "--dtype", "float32", "--repeats", "1", "--rest", "0",
                 "--out", str(tmp_path)]) == 0
    store = RunStore(tmp_path / "calibration")
    row, = store.rows()
    passes = store.passes(row["run_id"])
    assert row["kind"] == "heat" and row["model"] == "tiny" and len(passes) == row["passes"]
    assert [m["segment"] for m in row["segments"]] == [name for name, _ in segments(0.02, **CPU_SHAPES)]
    assert row["segments"][-1]["last"] == len(passes) - 1
    assert all(b.start_s >= a.start_s + a.duration_s for a, b in zip(passes, passes[1:]))  # one clock, in order
