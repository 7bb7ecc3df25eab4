"""Step-cost models: the roofline's arithmetic, the calibration file, and the decode line the
fast-forward relies on."""
import json

import numpy as np
import pytest

from core.config import get_preset
from core.roofline import get_gpu
from sim.cost import FORMAT, CalibratedCost, ConstantCost, RooflineCost, TableCost, bucket, parse_cost

MODEL, H200 = get_preset("qwen2.5-1.5b"), get_gpu("h200")


def calibration(**changes):
    """A calibration file's contents (the v2 form), with `changes`."""
    regime = {"launch_s": 1e-4, "weight_gbs": 2000.0, "matmul_tflops": 500.0, "kv_gbs": 2400.0,
              "attention_tflops": 300.0, "per_seq_s": 2e-6}
    d = {"format": FORMAT, "model": "qwen2.5-1.5b", "gpu": "NVIDIA H200", "dtype": "float16",
         "graph_buckets": [1, 2, 4, 8, 16, 24, 32],
         "constants": {"weight_bytes": MODEL.weight_bytes_read_per_pass(), "flops_per_token": MODEL.flops_per_token(0),
                       "kv_bytes_per_token": MODEL.kv_bytes_per_token(),
                       "attention_flops_per_pair": MODEL.flops_per_token(1) - MODEL.flops_per_token(0)},
         "parameters": {"decode1": dict(regime, weight_gbs=2800.0), "decode": regime, "prefill": dict(regime, launch_s=1e-3)}}
    d.update(changes)
    return d


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
    CalibratedCost(calibration()),
    CalibratedCost(calibration(parameters={r: {"launch_s": 2e-4, "weight_gbs": 1800.0, "matmul_tflops": 600.0,
                                               "kv_gbs": 2500.0} for r in ("decode1", "decode", "prefill")})),
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


def test_a_calibration_file_is_read_and_applied(tmp_path):
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(calibration(free_gib=100.0)))
    cost = CalibratedCost.from_json(path, model="qwen2.5-1.5b")
    assert cost.free_gib == 100.0
    w, kv, pair = MODEL.weight_bytes_read_per_pass(), MODEL.kv_bytes_per_token(), cost.pair_flops
    # one sequence decoding: the batch-1 regime, its own weight rate
    assert cost.pass_time([1], [99]) == pytest.approx(1e-4 + w / 2800e9 + 100 * kv / 2400e9 + 100 * pair / 300e12 + 2e-6)
    # three decoding: a graph at the padded batch of 4, memory-bound
    assert bucket(3, cost.buckets) == 4 and bucket(40, cost.buckets) == 40
    assert cost.pass_time([1, 1, 1], [10, 20, 30]) == pytest.approx(
        1e-4 + w / 2000e9 + 63 * kv / 2400e9 + 63 * pair / 300e12 + 6e-6)
    # a prompt beside a decode: the prefill regime, 513 tokens through the projections, compute-bound
    matmul = 513 * MODEL.flops_per_token(0) / 500e12
    assert matmul > w / 2000e9
    pairs = 512 * 513 / 2 + 101
    assert cost.pass_time([512, 1], [0, 100]) == pytest.approx(
        1e-3 + matmul + (512 + 101) * kv / 2400e9 + pairs * pair / 300e12 + 4e-6)
    assert parse_cost(str(path))[0].params == cost.params


def test_a_calibration_projects_to_another_gpu_by_its_bandwidth_and_arithmetic(tmp_path):
    cost = CalibratedCost(calibration())
    a10 = cost.projected(get_gpu("a10"), H200)
    assert a10.params["decode"][0] == cost.params["decode"][0]  # launches stay
    assert a10.params["decode"][1] == pytest.approx(2000.0 * 600 / 4150)  # weights: by bandwidth
    assert a10.params["prefill"][2] == pytest.approx(500.0 * 125 / 760)  # matmuls: by arithmetic
    assert a10.pass_time([1], [100]) > 4 * cost.pass_time([1], [100])


@pytest.mark.parametrize("changes, message", [
    ({"model": "llama-3-8b"}, "cost model for 'llama-3-8b', but this run simulates 'qwen2.5-1.5b'"),
    ({"format": "something/v0"}, "llm-sim-cost/v2"),
    ({"parameters": {"decode1": {}, "decode": {}, "prefill": {"kv_gbs": "fast"}}}, "prefill.kv_gbs must be a finite number"),
    ({"parameters": {"decode1": {}, "decode": {}, "prefill": {"launch_s": -1}}}, "prefill.launch_s must be"),
    ({"parameters": {"decode": {}}}, "parameters.decode1 must be an object"),
    ({"constants": {}}, "weight_bytes"),
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
    with pytest.raises(ValueError, match="no calibration named 'tpu'"):
        parse_cost("calibrated:tpu")
    with pytest.raises(ValueError, match="finite"):
        parse_cost("constant:nan")
    with pytest.raises(ValueError, match="not a number"):
        parse_cost("constant:fast")
    with pytest.raises(ValueError, match="unknown model preset"):
        parse_cost("roofline:h200", model="gpt-5")


def test_table_cost_interpolates_by_token_count():
    t = TableCost({1: 0.001, 101: 0.003})
    assert t.pass_time([1] * 51, [5] * 51) == pytest.approx(0.002)
    assert t.pass_time([500], [0]) == 0.003 and t.pass_time([1], [0]) == 0.001


def test_nan_or_infinity_in_a_calibration_file_is_refused(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(calibration()).replace("2400.0", "NaN"))
    with pytest.raises(ValueError, match="NaN is not a number"):
        CalibratedCost.from_json(path)
    with pytest.raises(ValueError, match="is a directory"):
        CalibratedCost.from_json(tmp_path)
