"""The Qwen2 model written here against Hugging Face transformers' Qwen2ForCausalLM."""
import pytest
pytest.importorskip("torch", reason="the engine's tests need the engine extra (torch)")
import json

import torch

transformers = pytest.importorskip("transformers")
from safetensors.torch import save_file

from core.config import ModelConfig, get_preset
from engine.model import DenseKVCache
from engine.weights import CheckpointError, build_random, engine_to_hf, load_checkpoint

TINY = get_preset("tiny")


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    """A tiny random Qwen2 written with transformers' own save_pretrained."""
    torch.manual_seed(0)
    hf_config = transformers.Qwen2Config(**TINY.to_hf_dict())
    hf_model = transformers.Qwen2ForCausalLM(hf_config).eval()
    with torch.no_grad():  # biases are zero at init; make them count
        for name, p in hf_model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    path = tmp_path_factory.mktemp("ckpt")
    hf_model.save_pretrained(path)
    return path, hf_model


def test_checkpoint_logits_match_transformers_for_prefill_and_20_cached_decode_steps(hf_checkpoint):
    path, hf_model = hf_checkpoint
    model = load_checkpoint(path, dtype="float32")
    prompt = torch.randint(0, TINY.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))

    with torch.no_grad():
        hf_out = hf_model(prompt, use_cache=True)
        positions = torch.arange(12).unsqueeze(0)
        cache = DenseKVCache(model.config, 1, 64, torch.float32, "cpu")
        ours = model.logits(model(prompt, positions, cache))
        assert relative_error(ours, hf_out.logits) < 1e-4

        past = hf_out.past_key_values
        token = hf_out.logits[:, -1].argmax(-1, keepdim=True)
        for step in range(20):
            pos = torch.tensor([[12 + step]])
            hf_out = hf_model(token, past_key_values=past, use_cache=True)
            past = hf_out.past_key_values
            ours = model.logits(model(token, pos, cache))
            assert relative_error(ours, hf_out.logits) < 1e-4, f"decode step {step}"
            token = hf_out.logits[:, -1].argmax(-1, keepdim=True)


def test_sharded_checkpoint_loads_like_a_single_file(hf_checkpoint, tmp_path):
    path, hf_model = hf_checkpoint
    hf_model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    a = load_checkpoint(path, dtype="float32")
    b = load_checkpoint(tmp_path, dtype="float32")
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name


def test_engine_weights_round_trip_through_hugging_face_names():
    model = build_random("tiny", dtype="float32", seed=3)
    hf_model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**TINY.to_hf_dict())).eval()
    hf_model.load_state_dict(engine_to_hf(model))
    tokens = torch.randint(0, TINY.vocab_size, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours = model.logits(model(tokens, torch.arange(9).expand(2, 9)))
        theirs = hf_model(tokens).logits
    assert relative_error(ours, theirs) < 1e-4


def _write_checkpoint(path, config: ModelConfig, tensors: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config.to_hf_dict()))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))


def test_checkpoint_with_a_missing_tensor_names_it(tmp_path):
    tensors = engine_to_hf(build_random("tiny", dtype="float32"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    tensors.pop("lm_head.weight")
    _write_checkpoint(tmp_path, TINY, tensors)
    with pytest.raises(CheckpointError, match="model.layers.1.mlp.up_proj.weight"):
        load_checkpoint(tmp_path)


def test_checkpoint_with_a_mis_shaped_tensor_names_it_and_both_shapes(tmp_path):
    tensors = engine_to_hf(build_random("tiny", dtype="float32"))
    tensors.pop("lm_head.weight")
    tensors["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(10, 64)
    _write_checkpoint(tmp_path, TINY, tensors)
    with pytest.raises(CheckpointError, match=r"k_proj.weight: \(10, 64\), expected \(32, 64\)"):
        load_checkpoint(tmp_path)


def test_directory_without_weights_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY.to_hf_dict()))
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_checkpoint(tmp_path)


def test_a_config_json_that_is_a_directory_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_checkpoint(tmp_path)


def test_random_weights_are_seeded():
    a = build_random("tiny", dtype="float32", seed=7).state_dict()
    b = build_random("tiny", dtype="float32", seed=7).state_dict()
    c = build_random("tiny", dtype="float32", seed=8).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["layers.0.mlp.gate_up_proj.weight"], c["layers.0.mlp.gate_up_proj.weight"])


def test_full_size_preset_has_the_published_parameter_count():
    config = get_preset("qwen2.5-1.5b")
    assert config.num_parameters == 1_543_714_304
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (12, 2, 128)
