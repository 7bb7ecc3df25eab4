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
    """A calibration file's contents (the form `calibrate fit` writes), with `changes`."""
    d = {"format": FORMAT, "model": "qwen2.5-1.5b", "gpu": "NVIDIA H200", "dtype": "float16",
         "graph_buckets": [1, 2, 4, 8, 16, 24, 32], "token_buckets": [32, 64, 128, 256, 512, 1024],
         "constants": {"weight_bytes": MODEL.weight_bytes_read_per_pass(), "flops_per_token": MODEL.flops_per_token(0),
                       "kv_bytes_per_token": MODEL.kv_bytes_per_token(),
                       "attention_flops_per_pair": MODEL.flops_per_token(1) - MODEL.flops_per_token(0)},
         "decode_attention": {"kv_heads": 2, "fills_gpu": 128, "block_n": 64, "small": [64, 128], "big": [16, 1024]},
         "parameters": {
             "decode1": {"fixed_s": 1.2e-3, "kv_gbs": 650.0, "serial_s_per_token": 2.5e-7},
             "decode": {"per_seq_s": 1.3e-6,
                        "graph_s": {"1": 1.2e-3, "2": 1.6e-3, "4": 1.7e-3, "8": 1.7e-3, "16": 1.75e-3, "24": 1.8e-3,
                                    "32": 1.85e-3},
                        "small": {"kv_gbs": 3500.0, "serial_s_per_token": 1.7e-6},
                        "big": {"kv_gbs": 4300.0, "serial_s_per_token": 3.7e-7}},
             "prefill": {"fixed_s": 1.1e-3, "weight_gbs": 4300.0, "matmul_tflops": 770.0, "kv_gbs": 1600.0,
                         "attention_tflops": 300.0, "serial_s_per_token": 8e-7, "per_seq_s": 6e-6}}}
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
    CalibratedCost(calibration(decode_attention={"kv_heads": 2, "fills_gpu": 64, "block_n": 16, "small": [8, 32],
                                                 "big": [4, 256]})),
    ConstantCost(0.01), TableCost({1: 0.001, 64: 0.002, 256: 0.004}),
])
def test_the_decode_line_is_the_pass_time_of_every_pass_it_covers(cost):
    rng = np.random.default_rng(0)
    for _ in range(30):
        b = int(rng.integers(1, 300))
        ctx = rng.integers(1, 3000, b)
        a, slope, valid = cost.decode_line(b, int(ctx.sum()), int(ctx.max()))
        for j in sorted({0, 1, min(valid - 1, 5000), min(valid - 1, 40)}):
            assert a + slope * j == pytest.approx(cost.pass_time([1] * b, (ctx + j).tolist()), rel=1e-12)
        if valid < 5000:  # past the crossing another line takes over
            assert a + slope * valid < cost.pass_time([1] * b, (ctx + valid).tolist()) * (1 - 1e-12)


def test_a_calibration_file_is_read_and_applied(tmp_path):
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(calibration(free_gib=100.0)))
    cost = CalibratedCost.from_json(path, model="qwen2.5-1.5b")
    assert cost.free_gib == 100.0
    w, kv, fpt, pair = (MODEL.weight_bytes_read_per_pass(), MODEL.kv_bytes_per_token(), MODEL.flops_per_token(0),
                        cost.pair_flops)
    # one sequence: the batch-1 kernels; its 100 positions are one slice (shorter than 128)
    assert cost.pass_time([1], [99]) == pytest.approx(1.2e-3 + 100 * kv / 650e9 + 100 * 2.5e-7)
    # three decoding: the graph at the padded batch of 4, small-batch rates, the longest context walked whole
    assert bucket(3, cost.buckets) == 4 and bucket(40, cost.buckets) == 40
    assert cost.pass_time([1, 1, 1], [10, 20, 30]) == pytest.approx(
        1.7e-3 + 63 * kv / 3500e9 + 31 * 1.7e-6 + 3 * 1.3e-6)
    # 64 decoding (64 x 2 KV heads fill the GPU): past the largest bucket the graph time follows the
    # last two buckets' line, 1.8 ms + (64 - 24) / 8 x 0.05 ms; 2,001 positions cut into 16 slices of
    # at least 1,024: the critical slice walks 1,024
    assert cost.pass_time([1] * 64, [2000] * 64) == pytest.approx(
        2.05e-3 + 64 * 2001 * kv / 4300e9 + 1024 * 3.7e-7 + 64 * 1.3e-6)
    # a prompt beside a decode: a prefill-kind pass, 513 tokens padded to the 1,024 bucket
    projections = 1024 * fpt / 770e12
    assert projections > w / 4300e9
    pairs = (512 * 513 + 1 * 202) / 2
    assert cost.pass_time([512, 1], [0, 100]) == pytest.approx(
        1.1e-3 + projections + max(613 * kv / 1600e9 + pairs * pair / 300e12, 512 * 8e-7) + 2 * 6e-6)
    assert parse_cost(str(path))[0].pass_time([512, 1], [0, 100]) == cost.pass_time([512, 1], [0, 100])


def test_a_calibration_projects_to_another_gpu_by_its_bandwidth_and_arithmetic():
    cost = CalibratedCost(calibration())
    a10 = cost.projected(get_gpu("a10"), H200)
    bw, fl = 600 / 4150, 125 / 760
    w = MODEL.weight_bytes_read_per_pass()
    assert a10.pp["fixed_s"] == cost.pp["fixed_s"]  # launches stay
    assert a10.p1["fixed_s"] == pytest.approx(1.2e-3 * 4150 / 600)  # batch 1's fixed time is the weights' read
    assert a10.p1["kv_gbs"] == pytest.approx(650.0 * bw)
    assert a10.pp["weight_gbs"] == pytest.approx(4300.0 * bw) and a10.pp["matmul_tflops"] == pytest.approx(770.0 * fl)
    assert a10.graph_s[4] == pytest.approx(1.7e-3 * (w / 600e9) / (w / 4150e9))  # weight-bound at batch 4
    assert a10.pass_time([1], [100]) > 5 * cost.pass_time([1], [100])
    assert "projected from NVIDIA H200" in a10.gpu


def test_the_committed_h200_calibration_loads_by_name():
    cost, gpu = parse_cost("calibrated:h200")
    assert cost.gpu == "NVIDIA H200" and cost.model == "qwen2.5-1.5b"
    assert 1e-3 < cost.pass_time([1], [256]) < 2e-3  # the engine's batch-1 decode is about 1.3 ms


@pytest.mark.parametrize("changes, message", [
    ({"model": "llama-3-8b"}, "cost model for 'llama-3-8b', but this run simulates 'qwen2.5-1.5b'"),
    ({"format": "something/v0"}, "llm-sim-cost/v2"),
    ({"decode_attention": None}, "decode_attention"),
    ({"parameters": dict(calibration()["parameters"], prefill={"kv_gbs": "fast"})}, "prefill.kv_gbs must be a finite number"),
    ({"parameters": dict(calibration()["parameters"], prefill={"fixed_s": -1})}, "prefill.fixed_s must be"),
    ({"parameters": {"decode": {}}}, "parameters.decode1 must be an object"),
    ({"parameters": dict(calibration()["parameters"], decode={"per_seq_s": 0, "small": {}, "big": {}})},
     "decode.graph_s must map decode buckets"),
    ({"constants": {}}, "weight_bytes"),
])
def test_a_bad_or_foreign_calibration_file_is_a_clear_error(tmp_path, changes, message):
    path = tmp_path / "c.json"
    d = calibration(**changes)
    if d["decode_attention"] is None:
        del d["decode_attention"]
    path.write_text(json.dumps(d))
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
    path.write_text(json.dumps(calibration()).replace("1600.0", "NaN"))
    with pytest.raises(ValueError, match="NaN is not a number"):
        CalibratedCost.from_json(path)
    with pytest.raises(ValueError, match="is a directory"):
        CalibratedCost.from_json(tmp_path)
