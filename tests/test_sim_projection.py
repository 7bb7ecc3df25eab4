"""A calibration projected to another model on the same GPU (`CalibratedCost.projected_to_model`,
`--cost calibrated:MODEL/NAME`, and `--cost auto` for a model without its own calibration): what
it keeps, how it scales, what it says on stderr, and the errors when a calibration of another
model is asked for without projection."""
import json
from dataclasses import replace

import numpy as np
import pytest

from core.config import PRESETS, get_preset
from core.roofline import get_gpu
from sim.__main__ import REPO, main
from sim.cost import default_cost, parse_cost

QWEN, TINY, H200 = get_preset("qwen2.5-1.5b"), get_preset("tiny"), get_gpu("h200")
TRACE = str(REPO / "traces" / "data" / "poisson_p256_r8.csv")


def shipped():
    return parse_cost("calibrated:h200")[0]


def passes(seed: int = 0):
    """Passes of every regime: batch 1, decode batches below and above the slicing's change (and
    past the schedule's), prompts, chunks on a context, mixed passes, an eager one."""
    rng = np.random.default_rng(seed)
    out = [([1], [c]) for c in (0, 100, 256, 2047, 9000)]
    for b in (2, 7, 64, 128, 300):
        ctx = [int(c) for c in rng.integers(16, 8000, b)]
        out.append(([1] * b, ctx))
    out += [([2048], [0]), ([512], [4096]), ([700, 300], [0, 0]), ([16] * 24, [0] * 24), ([9000, 4000], [0, 0])]
    out += [([1000] + [1] * 40, [512] + [int(c) for c in rng.integers(16, 4000, 40)])]
    return out


def test_projected_onto_its_own_model_a_calibration_is_unchanged():
    cost = shipped()
    same = cost.projected_to_model(QWEN, QWEN, H200)
    for new, ctx in passes():
        assert same.pass_time(new, ctx) == pytest.approx(cost.pass_time(new, ctx), rel=1e-12, abs=0), (len(new), ctx[:3])
    for b, total, longest in ((1, 300, 300), (8, 8 * 700, 900), (64, 64 * 1000, 3000)):
        assert same.decode_line(b, total, longest) == pytest.approx(cost.decode_line(b, total, longest), rel=1e-12)
    assert same.host == cost.host and same.heat == cost.heat and same.free_gib == cost.free_gib


def test_twice_the_layers_nearly_doubles_a_batch_1_decode_step():
    """Batch 1's step is its weights' read, per-layer kernel latency and its attention's walk,
    every layer: all but the tied embedding (467 MB of the 3.09 GB of weights, read once
    whatever the depth) doubles with the layers, so the step takes 1.8-2x as long, short of 2x."""
    deep = replace(QWEN, num_hidden_layers=2 * QWEN.num_hidden_layers, name="qwen-deep")
    cost = shipped()
    projected = cost.projected_to_model(QWEN, deep, H200)
    for context in (100, 1000, 4000):
        ratio = projected.pass_time([1], [context]) / cost.pass_time([1], [context])
        assert 1.8 < ratio < 2.0, (context, ratio)
    # the constants are the deeper model's; the card's rates are the measured one's
    assert projected.weight_bytes == pytest.approx(deep.weight_bytes_read_per_pass())
    assert projected.kv_bytes == 2 * cost.kv_bytes and projected.pp["weight_gbs"] == cost.pp["weight_gbs"]


def test_a_model_of_another_shape_gets_its_own_kv_heads_tiles_and_constants():
    projected = shipped().projected_to_model(QWEN, TINY, H200)
    assert projected.model == "tiny" and projected.projected_from == "qwen2.5-1.5b"
    assert projected.kv_heads == TINY.num_key_value_heads
    assert projected.tile_tokens == 128 // (TINY.num_attention_heads // TINY.num_key_value_heads)  # the engine's 128 rows
    assert projected.kv_bytes == TINY.kv_bytes_per_token() and projected.flops_per_token == TINY.flops_per_token(0)
    # a model of 2 layers of width 64: its passes a small share of the 1.5B's, never free
    for new, ctx in passes():
        assert 0 < projected.pass_time(new, ctx) < 0.3 * shipped().pass_time(new, ctx)


def test_calibrated_model_slash_name_asks_for_the_projection_and_says_so_once(capsys):
    cost, gpu = parse_cost("calibrated:qwen2.5-1.5b/h200", model="tiny")
    assert gpu.name == "NVIDIA H200" and cost.model == "tiny" and cost.projected_from == "qwen2.5-1.5b"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tiny's passes are priced by qwen2.5-1.5b's h200 calibration projected" in err
    assert "uncalibrated for tiny" in err
    parse_cost("calibrated:qwen2.5-1.5b/h200", model="tiny")
    assert capsys.readouterr().err == ""  # once per process
    same, _ = parse_cost("calibrated:qwen2.5-1.5b/h200", model="qwen2.5-1.5b")  # its own model: no projection
    assert same.projected_from is None and capsys.readouterr().err == ""
    a10_cost, a10 = parse_cost("calibrated:qwen2.5-1.5b/h200@a10", model="tiny")  # then to another card
    assert a10.name == "NVIDIA A10" and a10_cost.pass_time([1], [100]) > cost.pass_time([1], [100])


@pytest.mark.parametrize("spec, message", [
    ("calibrated:gpt-5/h200", "'gpt-5' is no model preset, so its calibration cannot be projected to tiny"),
    ("calibrated:qwen2.5-1.5b/a10", "no calibration named 'a10' for qwen2.5-1.5b"),
    ("calibrated:h200", "no calibration named 'h200' for tiny"),
])
def test_a_calibration_that_is_not_there_is_named(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_cost(spec, model="tiny")


def test_without_cost_a_model_without_a_calibration_projects_the_nearest(user_calibrations, monkeypatch, capsys):
    assert default_cost("qwen2.5-1.5b", None) == "calibrated:h200" and capsys.readouterr().err == ""
    assert default_cost("tiny", None) == "calibrated:qwen2.5-1.5b/h200"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no calibration for tiny on h200: using --cost calibrated:qwen2.5-1.5b/h200" in err
    assert "a projection" in err
    assert default_cost("tiny", "h200") == "calibrated:qwen2.5-1.5b/h200" and capsys.readouterr().err == ""
    # the nearest by weight bytes, among the models calibrated on that GPU
    deeper = {n: replace(QWEN, num_hidden_layers=n, name=f"qwen-l{n}") for n in (40, 56)}
    for n, model in deeper.items():
        monkeypatch.setitem(PRESETS, model.name, model)
    doc = json.loads(shipped_path().read_text())
    (user_calibrations / "qwen-l56").mkdir(parents=True)
    (user_calibrations / "qwen-l56" / "h200.json").write_text(json.dumps(doc | {"model": "qwen-l56"}))
    assert default_cost("qwen-l40", None) == "calibrated:qwen-l56/h200"  # 4.5 GB: nearer 5.7 than 3.1
    assert default_cost("tiny", None) == "calibrated:qwen2.5-1.5b/h200"
    # a GPU no model is calibrated on: the roofline, said once
    capsys.readouterr()
    assert default_cost("tiny", "a10") == "roofline:a10"
    assert "uncalibrated roofline" in capsys.readouterr().err
    # the model's own, once there is one: no note
    (user_calibrations / "tiny").mkdir()
    (user_calibrations / "tiny" / "h200.json").write_text(json.dumps(doc | {"model": "tiny"}))
    assert default_cost("tiny", None) == "calibrated:h200" and capsys.readouterr().err == ""


def shipped_path():
    return REPO / "sim" / "calibrations" / "qwen2.5-1.5b" / "h200.json"


def test_sim_run_says_which_calibration_it_projected(capsys):
    assert main(["run", "--model", "tiny", "--trace", TRACE, "--num-prompts", "20"]) == 0
    out, err = capsys.readouterr()
    assert "note: no calibration for tiny on h200: using --cost calibrated:qwen2.5-1.5b/h200" in err
    assert err.count("projected by the two models' roofline terms") == 1  # one line, not one per spec or pass
    assert "calibrated:qwen2.5-1.5b/h200" in out and "Successful requests:                    20" in out


def test_a_calibration_of_another_model_asked_for_by_name_is_refused(user_calibrations, capsys, tmp_path):
    """A file in tiny's folder that holds the 1.5B's calibration: refused, both models named, exit 2;
    the explicit MODEL/NAME form is the way to ask for a projection."""
    (user_calibrations / "tiny").mkdir(parents=True)
    (user_calibrations / "tiny" / "h200.json").write_text(shipped_path().read_text())
    out = tmp_path / "out"
    assert main(["run", "--model", "tiny", "--cost", "calibrated:h200", "--trace", TRACE, "--num-prompts", "5",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "cost model for 'qwen2.5-1.5b', but this run simulates 'tiny'" in err
    assert "--cost calibrated:qwen2.5-1.5b/NAME" in err and not out.exists()
