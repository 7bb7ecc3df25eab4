"""Step-cost models: the roofline's arithmetic, the calibration file, and the decode line the
fast-forward relies on."""
import json

import numpy as np
import pytest

from core.config import get_preset
from core.roofline import get_gpu
from sim.cost import FORMAT, CalibratedCost, ConstantCost, RooflineCost, TableCost, parse_cost, pass_features

MODEL, H200 = get_preset("qwen2.5-1.5b"), get_gpu("h200")


def test_roofline_decode_is_memory_bound_and_a_long_prefill_compute_bound():
    cost = RooflineCost(MODEL, H200, overhead_s=3e-4)
    decode = cost.pass_time([1], [1000])
    weights_s = MODEL.weight_bytes_read_per_pass() / 4150e9
    assert decode == pytest.approx(3e-4 + weights_s + 1001 * MODEL.kv_bytes_per_token() / 4150e9)
    prefill = cost.pass_time([4096], [0])
    flops = 4096 * MODEL.flops_per_token(0) + (MODEL.flops_per_token(1) - MODEL.flops_per_token(0)) * 4096 * 4097 / 2
    assert prefill == pytest.approx(3e-4 + flops / 760e12)


@pytest.mark.parametrize("cost", [
    RooflineCost(MODEL, H200),
    RooflineCost(MODEL, get_gpu("a10"), overhead_s=0),
    CalibratedCost({"coef": [1e-4, 2e-5, 3e-7, 4e-9, 5e-10], "floor_s": 2e-3}, {"coef": [0] * 5, "floor_s": 1e-3}),
    CalibratedCost({"coef": [3e-3, 1e-5, 1e-6, -2e-9, 1e-10], "floor_s": 2e-3}, {"coef": [0] * 5, "floor_s": 1e-3}),
    ConstantCost(0.01), TableCost({1: 0.001, 64: 0.002, 256: 0.004}),
])
def test_the_decode_line_is_the_pass_time_of_every_pass_it_covers(cost):
    rng = np.random.default_rng(0)
    for _ in range(30):
        b = int(rng.integers(1, 300))
        ctx = rng.integers(1, 3000, b)
        a, slope, valid = cost.decode_line(b, int(ctx.sum()))
        for j in sorted({0, 1, min(valid - 1, 5000), min(valid - 1, 40)}):
            assert a + slope * j == pytest.approx(cost.pass_time([1] * b, (ctx + j).tolist()), rel=1e-12)
        if valid < 5000:  # past the crossing another line takes over
            assert a + slope * valid < cost.pass_time([1] * b, (ctx + valid).tolist()) * (1 - 1e-12)


def calibration(**changes):
    d = {"format": FORMAT, "model": "qwen2.5-1.5b", "gpu": "NVIDIA H200", "dtype": "float16",
         "decode": {"coef": [8e-4, 1e-5, 0, 1e-9, 0], "floor_s": 5e-4},
         "prefill": {"coef": [1e-3, 0, 2e-6, 0, 1e-11], "floor_s": 1e-3},
         "fit": {"passes": 100, "mape": 0.03}}
    d.update(changes)
    return d


def test_a_calibration_file_is_read_and_applied(tmp_path):
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(calibration(free_gib=100.0)))
    cost = CalibratedCost.from_json(path, model="qwen2.5-1.5b")
    assert cost.free_gib == 100.0
    assert cost.pass_time([1, 1], [100, 300]) == pytest.approx(8e-4 + 2e-5 + 400e-9)  # decode model
    x = pass_features([512, 1], [0, 100])  # mixed: the prefill model
    assert x == [1, 2, 513, 100, 512 * 512 + 101]
    assert cost.pass_time([512, 1], [0, 100]) == pytest.approx(1e-3 + 513 * 2e-6 + x[4] * 1e-11)
    assert cost.pass_time([1], [1]) == 8e-4 + 1e-5 + 1e-9  # above its floor
    assert parse_cost(str(path))[0].decode_coef == cost.decode_coef


@pytest.mark.parametrize("changes, message", [
    ({"model": "llama-3-8b"}, "cost model for 'llama-3-8b', but this run simulates 'qwen2.5-1.5b'"),
    ({"format": "something/v0"}, "llm-sim-cost/v1"),
    ({"decode": {"coef": [1, 2, 3], "floor_s": 1e-3}}, "decode.coef must be 5 numbers"),
    ({"prefill": {"coef": [0] * 5}}, "prefill.floor_s must be a positive number"),
])
def test_a_bad_or_foreign_calibration_file_is_a_clear_error(tmp_path, changes, message):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(calibration(**changes)))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        CalibratedCost.from_json(path, model="qwen2.5-1.5b")


def test_cost_specs_from_the_command_line():
    cost, gpu = parse_cost("roofline:h200")
    assert isinstance(cost, RooflineCost) and gpu.name == "NVIDIA H200"
    assert parse_cost("constant:0.002")[0].pass_time([5], [0]) == 0.002
    with pytest.raises(ValueError, match="unknown GPU preset"):
        parse_cost("roofline:h900")
    with pytest.raises(ValueError, match="expected roofline:GPU"):
        parse_cost("magic")
    with pytest.raises(ValueError, match="does not exist"):
        parse_cost("missing.json")
    with pytest.raises(ValueError, match="unknown model preset"):
        parse_cost("roofline:h200", model="gpt-5")


def test_table_cost_interpolates_by_token_count():
    t = TableCost({1: 0.001, 101: 0.003})
    assert t.pass_time([1] * 51, [5] * 51) == pytest.approx(0.002)
    assert t.pass_time([500], [0]) == 0.003 and t.pass_time([1], [0]) == 0.001
