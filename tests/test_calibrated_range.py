"""A calibration knows the largest shapes its sweep timed, and a simulation says when it prices
passes beyond them (their times are extrapolated), by hand-made cases."""
import json

import numpy as np
import pytest

from calibrate.fit import sweep_range
from core.records import PassRecord
from sim.cost import parse_cost
from sim.build import RunSpec, simulate_spec
from sim.__main__ import main as sim_main
from traces.trace import Trace


def record(new, ctx, kind):
    return PassRecord(run_id="s", engine="continuous", step=0, kind=kind, new_tokens=new, context_lens=ctx,
                      start_s=0.0, duration_s=1e-3)


def test_the_sweeps_range_is_its_largest_pass_batch_and_sequence():
    passes = [record([1] * 8, [100] * 7 + [3000], "decode"), record([500, 700], [0, 2000], "prefill"),
              record([1] * 40, [10] * 40, "decode"), record([16] + [1] * 3, [5000, 1, 1, 1], "mixed")]
    assert sweep_range(passes) == {"pass_tokens": 1200, "decode_batch": 40, "context": 5016}


def test_passes_beyond_the_committed_calibrations_range_are_counted():
    cost, _ = parse_cost("calibrated:h200")
    top = cost.range
    assert top == {"pass_tokens": 32768, "decode_batch": 1024, "context": 32768}
    cost.pass_time([256] * 128, [0] * 128)  # 32,768 tokens: the sweep's largest, not beyond
    cost.pass_time([1] * 64, [4000] * 64)
    assert cost.extrapolated == {} and cost.extrapolation() is None
    cost.pass_time([256] * 256, [0] * 256)  # 65,536 tokens
    cost.pass_time([300] * 256, [0] * 256)  # 76,800
    cost.pass_time([1] * 2048, [100] * 2048)  # a decode batch of 2,048
    cost.pass_time([1], [40000])  # batch 1 at 40,001 positions
    assert cost.extrapolated == {"pass_tokens": [2, 76800], "decode_batch": [1, 2048], "context": [1, 40001]}
    text = cost.extrapolation()
    assert "2 passes beyond the calibration sweep's 32,768 tokens in a pass (up to 76,800)" in text
    assert "1 pass beyond the calibration sweep's 1,024 sequences in a decode pass" in text


def test_a_calibration_without_a_range_counts_nothing(tmp_path):
    d = json.load(open(parse_cost("calibrated:h200")[0].source))
    del d["range"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(d))
    cost, _ = parse_cost(str(path))
    cost.pass_time([256] * 256, [0] * 256)
    assert cost.extrapolation() is None


def test_a_simulation_says_when_its_passes_were_extrapolated(tmp_path, capsys):
    spec = RunSpec(trace="t", policy="continuous", cost="calibrated:h200", max_num_batched_tokens=131072,
                   max_num_seqs=256)
    big = Trace(np.zeros(256), np.full(256, 256), np.full(256, 4), name="big")  # one 65,536-token prompt pass
    result = simulate_spec(spec, trace=big)
    assert result.extrapolated and "65,536" in result.extrapolated
    small = Trace(np.arange(8) * 0.1, np.full(8, 256), np.full(8, 4), name="small")
    assert simulate_spec(spec, trace=small).extrapolated is None
    trace = tmp_path / "big.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join("0,256,4\n" for _ in range(256)))
    assert sim_main(["run", "--trace", str(trace), "--cost", "calibrated:h200", "--max-num-batched-tokens", "131072"]) == 0
    assert "note: 1 pass beyond the calibration sweep's 32,768 tokens in a pass (up to 65,536)" in capsys.readouterr().err
