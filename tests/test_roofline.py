"""The roofline reproduces the part0 series' five numbers for the A10."""
import pytest

from core.config import get_preset
from core.roofline import GPUS, get_gpu, roofline


def test_a10_reproduces_the_seed():
    r = roofline(get_preset("qwen2.5-1.5b"), get_gpu("a10"))
    assert round(r.weight_bytes / 1e9, 2) == 3.09
    assert round(r.batch1_ceiling_tok_s) == 194
    assert round(r.batch1_floor_ms, 2) == 5.15
    assert r.kv_bytes_per_token == 28_672
    assert round(r.ridge_flop_per_byte) == 208
    assert 705_000 < r.cache_token_positions < 715_000  # "about 711,000 token positions"
    assert r.cache_requests == 163  # of 4096 + 256 tokens


def test_multi_head_attention_would_cost_six_times_the_cache():
    from dataclasses import replace
    gqa = get_preset("qwen2.5-1.5b")
    mha = replace(gqa, num_key_value_heads=gqa.num_attention_heads)
    assert mha.kv_bytes_per_token(2) == 6 * gqa.kv_bytes_per_token(2) == 172_032  # 168 KiB
    assert roofline(mha, get_gpu("a10")).cache_requests == 27


def test_measured_free_memory_replaces_the_estimate():
    r = roofline(get_preset("qwen2.5-1.5b"), get_gpu("h200"), free_gib=120.0)
    assert r.free_measured and r.cache_token_positions == int(120 * 1024**3 // 28_672)


@pytest.mark.parametrize("name", ["a10", "l4", "a100-80gb", "h100-sxm", "h200"])
def test_presets_exist_for_the_common_cards(name):
    assert name in GPUS and roofline(get_preset("qwen2.5-1.5b"), get_gpu(name)).batch1_ceiling_tok_s > 0


def test_unknown_gpu_is_named():
    with pytest.raises(ValueError, match="unknown GPU preset 'v100'"):
        get_gpu("v100")


def test_a_card_torch_names_otherwise_finds_its_preset():
    """A sweep records the card as torch names it; the calibration is named for its preset (what
    `--gpu` and `--cost calibrated:NAME` take), for the cards whose names differ too."""
    from sim.cost import gpu_preset
    assert gpu_preset("NVIDIA H200")[0] == "h200" and gpu_preset("NVIDIA A10G")[0] == "a10g"
    assert gpu_preset("NVIDIA A100-SXM4-80GB") == ("a100-80gb", GPUS["a100-80gb"])
    assert gpu_preset("NVIDIA A100-SXM4-40GB")[1].memory_gb == 40
    assert gpu_preset("NVIDIA H100 80GB HBM3")[0] == "h100-sxm"
    assert gpu_preset("NVIDIA B300") == (None, None)
