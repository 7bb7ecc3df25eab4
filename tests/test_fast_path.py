"""The fused-kernel passes (the GPU path) give the eager model's tokens.

On the CPU the kernels run in Triton's interpreter, without CUDA graphs; tests/test_gpu.py runs
the same checks on a GPU with graphs captured.
"""
import pytest
pytest.importorskip("torch", reason="the engine's tests need the engine extra (torch)")
import torch

pytest.importorskip("triton")
if torch.cuda.is_available():  # there the same checks run on the full model, in tests/test_gpu.py
    pytest.skip("the interpreter checks are for machines without a GPU", allow_module_level=True)
from engine.cuda_graphs import GraphDecoder  # noqa: E402
from engine.engines import generate  # noqa: E402
from engine.weights import build_random  # noqa: E402

# Tiles small enough for the tiny model's shapes (hidden 64, head_dim 16, intermediate 128).
TINY_TILES = {"qkv": (8, 64, 4), "o": (8, 64, 4), "gate_up": (16, 64, 4), "down": (8, 128, 4), "lm_head": (4096, 64, 4)}
# The small-batch kernels' (rows, tile width, warps, splits, stages) for the same shapes: few
# programs, so the interpreter runs a step quickly; the splits exercise the split reduction.
TINY_SMALL = {"qkv": (8, 32, 4, 2, 1), "o": (32, 32, 4, 2, 1), "gate_up": (64, 64, 4, 1, 1),
              "down": (32, 32, 4, 4, 1), "lm_head": (8192, 64, 4, 1, 1)}


def decoder(model, small_max=16, **kwargs):
    from engine.cuda_graphs import GraphDecoder
    return GraphDecoder(model, False, TINY_TILES, small_tiles=TINY_SMALL, small_max=small_max, **kwargs)


@pytest.fixture(scope="module")
def model():
    return build_random("tiny", dtype="float32", seed=0, std=0.3)


def test_batch_1_fused_decode_gives_the_eager_tokens(model):
    prompt = [[(7 * i + 3) % 150000 for i in range(12)]]
    eager = generate(model, prompt, 8, engine="cached").tokens
    fast = generate(model, prompt, 8, engine="cached", decoder=GraphDecoder(model, False, TINY_TILES)).tokens
    assert fast == eager


@pytest.mark.parametrize("batch", [2, 3, 8])
def test_small_batch_fused_decode_gives_the_eager_tokens(model, batch):
    prompts = [[(5 * i + b) % 150000 for i in range(9)] for b in range(batch)]
    eager = generate(model, prompts, 5, engine="batched").tokens
    dec = decoder(model)
    assert dec.fast.uses_small(batch)
    assert generate(model, prompts, 5, engine="batched", decoder=dec).tokens == eager


def test_batched_decode_and_prefill_give_the_eager_tokens(model):
    """Batches past `small_max` decode on cuBLAS and the small kernels between (here batch 3 with
    small_max 2)."""
    prompts = [[(5 * i + b) % 150000 for i in range(9)] for b in range(3)]
    eager = generate(model, prompts, 6, engine="batched").tokens
    dec = decoder(model, small_max=2)
    assert not dec.fast.uses_small(3)
    assert generate(model, prompts, 6, engine="batched", decoder=dec).tokens == eager


def test_prompts_of_different_lengths_prefill_eagerly_then_decode_fused(model):
    prompts = [[(3 * i + b) % 150000 for i in range(5 + 4 * b)] for b in range(3)]
    eager = generate(model, prompts, 5, engine="batched").tokens
    fast = generate(model, prompts, 5, engine="batched", decoder=decoder(model)).tokens
    assert fast == eager


def test_the_decoder_reuses_its_cache_across_runs_of_one_shape(model):
    decoder = GraphDecoder(model, False, TINY_TILES)
    prompt = [[(11 * i) % 150000 for i in range(7)]]
    first = generate(model, prompt, 4, engine="cached", decoder=decoder)
    cache = decoder._cache
    second = generate(model, prompt, 4, engine="cached", decoder=decoder)
    assert decoder._cache is cache and first.tokens == second.tokens


def test_graphs_need_a_gpu_model(model):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="CUDA graphs need the model on a CUDA device"):
        GraphDecoder(model)


def test_the_small_batch_kernels_are_the_default_only_at_the_widths_they_were_measured_faster_at(model, monkeypatch):
    """Qwen2.5-1.5B's hidden size (1536) decodes batches 2..8 on them; other widths (an 8B's 4096,
    the tiny model's 64) stay on cuBLAS unless small_max asks."""
    from dataclasses import replace

    from engine.fast_path import FastPath
    assert FastPath(model).small_max == 1
    assert FastPath(model, small_max=4).small_max == 4
    monkeypatch.setattr(model, "config", replace(model.config, hidden_size=1536))
    fast = FastPath(model)
    assert fast.small_max == 8 and fast.uses_small(8) and not fast.uses_small(9)
