"""Step-cost models: the roofline's arithmetic, the calibration file, and the decode line the
fast-forward relies on."""
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from core.config import get_preset
from core.roofline import get_gpu
from sim.cost import FORMAT, CalibratedCost, ConstantCost, RooflineCost, ScaledCost, TableCost, bucket, parse_cost

MODEL, H200 = get_preset("qwen2.5-1.5b"), get_gpu("h200")


def calibration(**changes):
    """A calibration file's contents (the form `calibrate fit` writes), with `changes`."""
    d = {"format": FORMAT, "model": "qwen2.5-1.5b", "gpu": "NVIDIA H200", "dtype": "float16",
         "graph_buckets": [1, 2, 4, 8, 16, 24, 32], "token_buckets": [32, 64, 128, 256, 512, 1024],
         "constants": {"weight_bytes": MODEL.weight_bytes_read_per_pass(), "flops_per_token": MODEL.flops_per_token(0),
                       "kv_bytes_per_token": MODEL.kv_bytes_per_token()},
         "decode_attention": {"kv_heads": 2, "fills_gpu": 128, "block_n": 64, "small": [64, 128], "big": [16, 1024]},
         "chunk_attention": {"tile_tokens": 21},
         "waves": {"sms": 132, "decode_programs_per_sm": 4, "prefill_programs_per_sm": 1},
         "parameters": {
             "decode1": {"fixed_s": 1.2e-3, "serial_s_per_token": 2.5e-7, "merge_s": 9e-6},
             "decode": {"graph_s": {"1": 1.2e-3, "2": 1.6e-3, "4": 1.7e-3, "8": 1.7e-3, "16": 1.75e-3, "24": 1.8e-3,
                                    "32": 1.85e-3},
                        "small": {"kv_gbs": 4000.0, "block_s": 4e-6, "merge_s": 9e-6, "program_s": 1e-7, "tail": 0.8},
                        "big": {"kv_gbs": 4500.0, "block_s": 6e-5, "merge_s": 3e-5, "program_s": 6e-8, "tail": 0.7}},
             "prefill": {"fixed_s": 1.1e-3, "weight_gbs": 4300.0, "matmul_tflops": 770.0, "eager_s": 4e-3,
                         "block_s": 5e-5, "program_s": 2e-5, "shared": 0.85, "per_seq_s": 6e-6}}}
    d.update(changes)
    return d


def with_spread(d: dict, small: float = 3e-8, big: float = 1.5e-7, start: int = 16) -> dict:
    """A calibration with decode attention's spread term on."""
    d = json.loads(json.dumps(d))
    decode = d["parameters"]["decode"]
    decode["small"]["spread_s"], decode["big"]["spread_s"], decode["spread_from"] = small, big, start
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
    CalibratedCost(with_spread(calibration())),
    CalibratedCost(with_spread(calibration(decode_attention={"kv_heads": 2, "fills_gpu": 64, "block_n": 16,
                                                             "small": [8, 32], "big": [4, 256]}), start=0)),
    CalibratedCost(with_spread(calibration(decode_attention={"kv_heads": 2, "fills_gpu": 128, "block_n": 16,
                                                             "small": [16, 32], "big": [4, 256], "programs": 64}))),
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
        if valid < 5000 and not isinstance(cost, CalibratedCost):  # past the crossing another line takes over
            # (a step up, or a boundary nothing steps at; the calibrated model's slices can also step down)
            assert a + slope * valid <= cost.pass_time([1] * b, (ctx + valid).tolist()) * (1 + 1e-12)


def test_the_calibrated_decode_line_runs_to_its_next_kink():
    """The fast-forward's lines are long: a batch's line holds until a slicing kink or a wave
    step (hundreds of passes here), not to the next block of 64 positions."""
    cost = CalibratedCost(calibration())
    for b, context in ((8, 300), (24, 1500), (200, 1500)):
        ctx = np.arange(context, context + b)
        a, slope, valid = cost.decode_line(b, int(ctx.sum()), int(ctx.max()))
        assert valid >= 300, (b, context, valid)
        assert a + slope * (valid - 1) == pytest.approx(cost.pass_time([1] * b, (ctx + valid - 1).tolist()), rel=1e-12)


def test_a_batch_of_spread_contexts_pays_for_the_rows_launched_past_the_mean_slices():
    """spread_s * max(0, B - spread_from) * (live(Lm) - live(Lbar)) on top of the form without it:
    nothing for one context, nothing for batches within spread_from rows, by the padded batch."""
    plain, spread = CalibratedCost(calibration()), CalibratedCost(with_spread(calibration(), small=3e-8, start=16))
    for S, ctx in ((8, [300] * 8), (24, [1500] * 24)):
        assert spread.pass_time([1] * S, ctx) == plain.pass_time([1] * S, ctx)  # one context: no term
    ctx = [100] * 7 + [5000]
    assert spread.pass_time([1] * 8, ctx) == plain.pass_time([1] * 8, ctx)  # 8 rows: within spread_from
    ctx = [100] * 23 + [5000]  # 24 rows, 8 past spread_from; slices of 128 positions (small batches)
    live = lambda L: max(1.0, L / 128 + 0.5)  # noqa: E731
    extra = 3e-8 * (24 - 16) * (live(5001) - live(-(-sum(ctx) // 24) + 1))
    assert spread.pass_time([1] * 24, ctx) - plain.pass_time([1] * 24, ctx) == pytest.approx(extra, rel=1e-9)
    assert spread.pass_time([1] * 20, ctx[-20:]) > plain.pass_time([1] * 20, ctx[-20:])  # 20 sequences: padded to 24


def test_a_calibration_file_is_read_and_applied(tmp_path):
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(calibration(free_gib=100.0)))
    cost = CalibratedCost.from_json(path, model="qwen2.5-1.5b")
    assert cost.free_gib == 100.0
    w, kv, fpt = MODEL.weight_bytes_read_per_pass(), MODEL.kv_bytes_per_token(), MODEL.flops_per_token(0)
    block = kv * 64 / 2  # one KV head's 64 positions, every layer
    # one sequence: the batch-1 kernels; its 100 positions are one slice (shorter than 128), walked in
    # whole blocks of 64 as expected over the context's offsets (100 + 32 positions, at most the slice's
    # 128); 100 / 128 + 1/2 slices merged as expected
    assert cost.pass_time([1], [99]) == pytest.approx(1.2e-3 + 128 * 2.5e-7 + (100 / 128 + 0.5) * 9e-6)
    # three decoding: the graph at the padded batch of 4, small-batch slicing (4 x 2 KV heads < 128);
    # mean length 21, one slice of (21 + 32) / 64 blocks each: one partial wave of 6 programs, its
    # latency (1 + 53 / 64 blocks) and its read at `tail` (0.8) of its time at the bandwidth; the
    # longest (31 positions) walks (31 + 32) / 64 blocks, shorter than the wave
    assert bucket(3, cost.buckets) == 4 and bucket(40, cost.buckets) == 40
    assert cost.pass_time([1, 1, 1], [10, 20, 30]) == pytest.approx(
        1.7e-3 + max((1 + 53 / 64) * 4e-6 + 0.8 * 6 * 53 / 64 * block / 4000e9, (1 + 63 / 64) * 4e-6) + 9e-6 + 6 * 1e-7)
    # 600 decoding at 2,048 cached (waves by hand): past the largest bucket, the graph time follows
    # the last two buckets' line, 1.85 ms + (600 - 32) / 8 x 0.05 ms; 2,049 positions cut into slices
    # of 1,024 (the big slicing: 16 slices of at least 1,024), 2,049 / 1,024 slices' worth of 16 blocks:
    # 2 x 600 x 2,049 / 1,024 = 2,401.2 programs, 4 waves of 528 and 289.2 more (a walk and their
    # read at `tail`, 0.7, of its time at the bandwidth); 2,049 / 1,024 + 1/2 merged
    P = 2 * 600 * 2049 / 1024
    rb = block / 4500e9
    waves = 4 * max(17 * 6e-5, 528 * 16 * rb) + 17 * 6e-5 + 0.7 * (P - 4 * 528) * 16 * rb
    assert cost.pass_time([1] * 600, [2048] * 600) == pytest.approx(
        1.85e-3 + 568 / 8 * 0.05e-3 + waves + (2049 / 1024 + 0.5) * 3e-5 + P * 6e-8)
    # a prompt beside a decode: a prefill-kind pass, 513 tokens padded to the 1,024 bucket; chunk
    # attention: 25 tiles of 21 tokens for the prompt, 1 for the decode, 52 programs over 2 KV heads
    # in one wave; they walk 2 x (21 x 25 x 24 / 2 + 512 + 100 + 1) / 64 + 52 / 2 blocks, the longest 8
    projections = 1024 * fpt / 770e12
    assert projections > w / 4300e9
    work = 2 * (21 * 25 * 24 / 2 + 512 + 101) / 64 + 26
    assert cost.pass_time([512, 1], [0, 100]) == pytest.approx(
        1.1e-3 + projections + max(8 * 5e-5 + 2e-5, work / 52 * 5e-5 + 2e-5) + 2 * 6e-6)
    # a prompt of 2,048 tokens: past the largest token bucket, launched kernel by kernel (eager_s);
    # 98 tiles a KV head, 196 programs: two waves of 132, past the first `shared` as long
    work = 2 * (21 * 98 * 97 / 2 + 2048) / 64 + 98
    assert cost.pass_time([2048], [0]) == pytest.approx(
        1.1e-3 + max(w / 4300e9, 2048 * fpt / 770e12) + max(32 * 5e-5 + 2e-5, 2 * 0.85 * (work / 196 * 5e-5 + 2e-5))
        + 6e-6 + 4e-3)
    assert parse_cost(str(path))[0].pass_time([512, 1], [0, 100]) == cost.pass_time([512, 1], [0, 100])


def test_a_calibration_projects_to_another_gpu_by_its_bandwidth_and_arithmetic():
    cost = CalibratedCost(calibration())
    a10 = cost.projected(get_gpu("a10"), H200)
    bw, fl = 600 / 4150, 125 / 760
    w = MODEL.weight_bytes_read_per_pass()
    assert a10.pp["fixed_s"] == cost.pp["fixed_s"]  # launches stay
    assert a10.p1["fixed_s"] == pytest.approx(1.2e-3 * 4150 / 600)  # batch 1's fixed time is the weights' read
    assert a10.p1["serial_s_per_token"] == pytest.approx(2.5e-7 / bw)
    assert a10.pp["weight_gbs"] == pytest.approx(4300.0 * bw) and a10.pp["matmul_tflops"] == pytest.approx(770.0 * fl)
    assert a10.pd_rates[True]["block_s"] == pytest.approx(6e-5 / bw)  # decode attention's walk through the cache
    assert a10.pp["block_s"] == pytest.approx(5e-5 / fl)  # chunk attention's arithmetic
    assert a10.pd_rates[True]["program_s"] == 6e-8  # a program's start stays
    assert a10.graph_s[4] == pytest.approx(1.7e-3 * (w / 600e9) / (w / 4150e9))  # weight-bound at batch 4
    assert a10.pass_time([1], [100]) > 5 * cost.pass_time([1], [100])
    assert "projected from NVIDIA H200" in a10.gpu


def test_a_scaled_cost_model_moves_every_pass_and_keeps_the_rest():
    base, _ = parse_cost("calibrated:h200")
    longer, shorter = ScaledCost(base, 1.02), ScaledCost(base, 0.98)
    for new, ctx in (([1] * 64, [300] * 64), ([4096, 64], [0, 0]), ([1], [256]), ([1] * 8 + [512], [100] * 8 + [0])):
        assert longer.pass_time(new, ctx) == pytest.approx(1.02 * base.pass_time(new, ctx), rel=1e-12)
        assert shorter.pass_time(new, ctx) == pytest.approx(0.98 * base.pass_time(new, ctx), rel=1e-12)
    a, b, valid = base.decode_line(64, 64 * 300, 300)
    assert longer.decode_line(64, 64 * 300, 300) == pytest.approx((1.02 * a, 1.02 * b, valid), rel=1e-12)
    # the host's time, the heat and the scatter are the engine's, not its passes': kept as they are
    assert longer.host is base.host and longer.heat is base.heat and longer.noise is base.noise
    assert ScaledCost(RooflineCost(MODEL, H200), 2.0).decode_line(4, 400, 100) is not None

    class StepByStep(ConstantCost):
        def decode_line(self, *args):
            return None
    assert ScaledCost(StepByStep(0.01), 1.5).decode_line(4, 40, 10) is None
    with pytest.raises(ValueError, match="positive factor"):
        ScaledCost(base, 0.0)


def test_a_cost_spec_followed_by_a_factor_scales_every_pass():
    base, gpu = parse_cost("calibrated:h200")
    slower, same_gpu = parse_cost("calibrated:h200*1.02")
    assert isinstance(slower, ScaledCost) and slower.factor == 1.02 and same_gpu is gpu
    for new, ctx in (([1] * 64, [300] * 64), ([4096], [0]), ([1], [256])):
        assert slower.pass_time(new, ctx) == pytest.approx(1.02 * base.pass_time(new, ctx), rel=1e-12)
    assert slower.host == base.host and slower.heat == base.heat  # the host and the heat are not the passes'
    projected, a10 = parse_cost("calibrated:h200@a10*0.5")
    assert a10.name == parse_cost("calibrated:h200@a10")[1].name
    assert projected.pass_time([1], [256]) == pytest.approx(0.5 * parse_cost("calibrated:h200@a10")[0].pass_time([1], [256]))
    assert parse_cost("constant:0.002*3")[0].pass_time([5], [0]) == pytest.approx(0.006)
    assert parse_cost("constant:0.002*2*2")[0].pass_time([5], [0]) == pytest.approx(0.008)  # (each factor in turn)


@pytest.mark.parametrize("spec, message", [
    ("calibrated:h200*fast", "'fast' after '*' must be a factor from 0.01 to 100"),
    ("calibrated:h200*0", "'0' after '*' must be a factor"),
    ("calibrated:h200*-1", "'-1' after '*' must be a factor"),
    ("calibrated:h200*nan", "'nan' after '*' must be a factor"),
    ("calibrated:h200*", "'' after '*' must be a factor"),
    ("*1.02", "name the cost model to scale before '*'"),
    ("calibrated:tpu*1.02", "no calibration named 'tpu'"),
])
def test_a_bad_factor_on_a_cost_spec_is_a_clear_error(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_cost(spec)


def test_the_committed_h200_calibration_loads_by_name():
    cost, gpu = parse_cost("calibrated:h200")
    assert cost.gpu == "NVIDIA H200" and cost.model == "qwen2.5-1.5b"
    assert 1e-3 < cost.pass_time([1], [256]) < 2e-3  # the engine's batch-1 decode is about 1.3 ms


@pytest.mark.parametrize("changes, message", [
    ({"model": "llama-3-8b"}, "cost model for 'llama-3-8b', but this run simulates 'qwen2.5-1.5b'"),
    ({"format": "something/v0"}, "llm-sim-cost/v5"),
    ({"format": "llm-sim-cost/v4"}, "expected a calibration file with \"format\": \"llm-sim-cost/v5\""),
    ({"decode_attention": None}, "decode_attention"),
    ({"waves": None}, "missing 'waves'"),
    ({"chunk_attention": None}, "missing 'chunk_attention'"),
    ({"waves": {"sms": 0, "decode_programs_per_sm": 4, "prefill_programs_per_sm": 1}}, "waves.sms must hold whole"),
    ({"waves": {"sms": 132, "prefill_programs_per_sm": 1}}, "missing 'decode_programs_per_sm'"),
    ({"chunk_attention": {"tile_tokens": 2.5}}, "chunk_attention.tile_tokens must hold whole"),
    ({"parameters": dict(calibration()["parameters"], prefill={"block_s": -1})}, "prefill.block_s must be"),
    ({"parameters": dict(calibration()["parameters"], prefill={"weight_gbs": "fast"})}, "prefill.weight_gbs must be a finite number"),
    ({"parameters": dict(calibration()["parameters"], prefill={"fixed_s": -1})}, "prefill.fixed_s must be"),
    ({"parameters": {"decode": {}}}, "parameters.decode1 must be an object"),
    ({"parameters": dict(calibration()["parameters"], decode={"small": {}, "big": {}})},
     "decode.graph_s must map decode buckets"),
    ({"constants": {}}, "weight_bytes"),
])
def test_a_bad_or_foreign_calibration_file_is_a_clear_error(tmp_path, changes, message):
    path = tmp_path / "c.json"
    d = calibration(**changes)
    for key in ("decode_attention", "waves", "chunk_attention"):
        if d[key] is None:
            del d[key]
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
    path.write_text(json.dumps(calibration()).replace("4300.0", "NaN"))
    with pytest.raises(ValueError, match="NaN is not a number"):
        CalibratedCost.from_json(path)
    with pytest.raises(ValueError, match="is a directory"):
        CalibratedCost.from_json(tmp_path)


def test_the_committed_calibrations_decode_lines_hold_at_their_last_pass():
    """Found in a saturated replay: a batch of 256 whose next pass opens a partial wave (a step
    up of 0.64 ms) got a line valid for 1,024 passes with that step as its slope (the simulated
    TPOT came out 12 times the stepped one). Every line must hold at its last pass: the committed
    calibration's (whose batches that fill the GPU, priced by their programs' schedule, have none)
    and the one before it, whose waves priced every batch."""
    rng = np.random.default_rng(1)
    cases = [(256, 269970, 4108)]
    for _ in range(300):
        b = int(rng.choice([2, 8, 24, 64, 100, 144, 200, 256]))
        ctx = np.minimum(rng.lognormal(7.0, 1.0, b).astype(int) + 16, 16000)
        cases.append((b, int(ctx.sum()), int(ctx.max())))
    committed = parse_cost("calibrated:h200")[0]
    waves = parse_cost(str(Path(__file__).resolve().parents[1] / "results" / "calibration" / "h200-waves.json"))[0]
    assert committed.schedule is not None and waves.schedule is None
    for cost, (b, total, longest) in [(c, case) for c in (committed, waves) for case in cases]:
        rest = total - longest
        ctx = [longest] + [rest // (b - 1)] * (b - 2) + [rest - rest // (b - 1) * (b - 2)]
        line = cost.decode_line(b, total, longest)
        if cost.schedule is not None and cost.fills(b):
            assert line is None
            continue
        a, slope, valid = line
        for j in {0, 1, valid - 1}:
            assert a + slope * j == pytest.approx(cost.pass_time([1] * b, [c + j for c in ctx]), rel=1e-5), (b, total,
                                                                                                           longest, j)


def test_a_decode_launch_keeps_to_the_files_programs_below_the_batches_that_fill_the_gpu():
    """`programs`: a batch under `fills_gpu` pairs gets the small slicing's slices, fewer once its
    pairs times them pass that many (the engine's rule, core.slicing); a file without it gives
    every such batch the small slicing's slices, as the engine did before."""
    attention = {"kv_heads": 2, "fills_gpu": 256, "block_n": 64, "small": [16, 128], "big": [16, 1024]}
    cost = CalibratedCost(calibration(decode_attention=dict(attention, programs=512)))
    old = CalibratedCost(calibration(decode_attention=attention))
    assert [cost.slicing_at(B)[0] for B in (1, 16, 17, 32, 64, 127, 128)] == [16, 16, 15, 8, 4, 2, 16]
    assert {old.slicing_at(B) for B in (1, 16, 64, 127)} == {(16, 128)} and old.slicing_at(128) == (16, 1024)
    # a context of 4,097 positions at batch 64: 4 slices of 1,088 against 16 of 320
    assert cost.slice_of(4097, 64)[0] == 1088 and old.slice_of(4097, 64)[0] == 320
    assert cost.pass_time([1] * 64, [4096] * 64) != old.pass_time([1] * 64, [4096] * 64)
    with pytest.raises(ValueError, match="decode_attention.programs"):
        CalibratedCost(calibration(decode_attention=dict(attention, programs=0)))


def test_a_prefill_pass_takes_the_k_norm_of_its_weight_read_and_its_arithmetic():
    from sim.calibrated import smoothed
    assert smoothed(3.0, 4.0, 0.0) == 4.0 and smoothed(3.0, 4.0, 1.0) == pytest.approx(7.0)
    assert smoothed(3.0, 4.0, 2.0) == pytest.approx(5.0) and smoothed(3.0, 4.0, 200.0) == pytest.approx(4.0)
    assert smoothed(3.0, 4.0, 0.5) == pytest.approx(7.0)  # below 1 counts as 1: never less than no overlap
    assert np.allclose(smoothed(np.array([3.0, 0.0]), np.array([4.0, 0.0]), 2.0), [5.0, 0.0])
    d = calibration()
    d["parameters"]["prefill"]["smooth"] = 2.0
    plain, smooth = CalibratedCost(calibration()), CalibratedCost(d)
    weights = MODEL.weight_bytes_read_per_pass() / 4300e9
    for m in (64, 512, 1024):
        projections = m * MODEL.flops_per_token(0) / 770e12
        extra = math.hypot(weights, projections) - max(weights, projections)
        assert smooth.pass_time([m], [0]) - plain.pass_time([m], [0]) == pytest.approx(extra, rel=1e-9), m
