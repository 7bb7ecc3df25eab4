"""Building a model: from a Hugging Face checkpoint directory, or from a preset with random weights.

A checkpoint directory has the layout of a model on the Hugging Face Hub (Qwen2/Qwen2.5, Llama 3.x,
Qwen3, Mistral): `config.json` and either one `model.safetensors` or shards listed in
`model.safetensors.index.json`. Tensor names are
Hugging Face's (`model.layers.0.self_attn.q_proj.weight`, ...); q/k/v and gate/up are fused here
into the engine's `qkv_proj` and `gate_up_proj`.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from core.config import PRESETS, ModelConfig, get_preset
from engine.model import DecoderModel

DTYPES = {"float16": torch.float16, "fp16": torch.float16, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: missing files, missing or mis-shaped tensors."""


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"--dtype: unknown dtype {name!r}; use one of float16, bfloat16, float32") from None


def _checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    single = path / "model.safetensors"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{index}: not valid JSON ({e})") from None
        except (KeyError, TypeError, AttributeError):
            raise CheckpointError(f"{index}: expected an object with a \"weight_map\" of tensor name -> "
                                  "shard file") from None
        if not shards or not all(isinstance(s, str) for s in shards):
            raise CheckpointError(f"{index}: its weight_map names no shard files")
        files = [path / s for s in shards]
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise CheckpointError(f"{index}: lists shards that are not there: {', '.join(missing)}")
        return files
    if single.exists():
        return [single]
    raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json")


def read_checkpoint(path: str | Path) -> dict[str, Tensor]:
    """Every tensor of a safetensors checkpoint (single file or sharded), by its Hub name."""
    from safetensors.torch import load_file

    tensors: dict[str, Tensor] = {}
    for f in _checkpoint_files(Path(path)):
        try:
            tensors.update(load_file(str(f)))
        except Exception as e:  # safetensors raises its own error types for empty, truncated or corrupt files
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise CheckpointError(f"{f}: not a readable safetensors file ({first})") from None
    return tensors


def _expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of `config` holds, by its Hugging Face name, and its shape."""
    h, q, kv, inter, d = config.hidden_size, config.q_size, config.kv_size, config.intermediate_size, config.head_dim
    expected = {"model.embed_tokens.weight": (config.vocab_size, h), "model.norm.weight": (h,)}
    if not config.tie_word_embeddings:
        expected["lm_head.weight"] = (config.vocab_size, h)
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        expected.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        })
        if config.attention_bias:
            expected.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                             p + "self_attn.v_proj.bias": (kv,)})
        if config.qk_norm:
            expected.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
    return expected


def hf_to_engine(config: ModelConfig, tensors: dict[str, Tensor], source: str = "checkpoint") -> dict[str, Tensor]:
    """Map Hugging Face tensor names to this engine's (fusing q/k/v and gate/up), checking that
    every tensor is there with the shape the config implies. A tied model's checkpoint may hold
    lm_head.weight or not; it is the embedding either way."""
    expected = _expected_shapes(config)
    missing = [k for k in expected if k not in tensors]
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise CheckpointError(f"{source}: missing tensors {', '.join(missing[:5])}{more}")
    extra = [k for k in tensors if k.endswith(".bias") and k not in expected]
    if extra:  # a bias the config does not give the model would be dropped: the checkpoint is another model's
        raise CheckpointError(f"{source}: tensor {extra[0]} is not in a {config.model_type} model of this config.json")
    bad = [f"{k}: {tuple(tensors[k].shape)}, expected {shape}" for k, shape in expected.items()
           if tuple(tensors[k].shape) != shape]
    if bad:
        raise CheckpointError(f"{source}: mis-shaped tensors (the config says otherwise): " + "; ".join(bad[:5]))

    out = {"embed_tokens.weight": tensors["model.embed_tokens.weight"], "norm.weight": tensors["model.norm.weight"]}
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = tensors["lm_head.weight"]
    for i in range(config.num_hidden_layers):
        p, e = f"model.layers.{i}.", f"layers.{i}."
        a = p + "self_attn."
        out[e + "input_layernorm.weight"] = tensors[p + "input_layernorm.weight"]
        out[e + "post_attention_layernorm.weight"] = tensors[p + "post_attention_layernorm.weight"]
        out[e + "self_attn.qkv_proj.weight"] = torch.cat([tensors[a + f"{x}_proj.weight"] for x in "qkv"])
        if config.attention_bias:
            out[e + "self_attn.qkv_proj.bias"] = torch.cat([tensors[a + f"{x}_proj.bias"] for x in "qkv"])
        if config.qk_norm:
            out[e + "self_attn.q_norm.weight"] = tensors[a + "q_norm.weight"]
            out[e + "self_attn.k_norm.weight"] = tensors[a + "k_norm.weight"]
        out[e + "self_attn.o_proj.weight"] = tensors[a + "o_proj.weight"]
        out[e + "mlp.gate_up_proj.weight"] = torch.cat([tensors[p + "mlp.gate_proj.weight"],
                                                        tensors[p + "mlp.up_proj.weight"]])
        out[e + "mlp.down_proj.weight"] = tensors[p + "mlp.down_proj.weight"]
    return out


def engine_to_hf(model: DecoderModel) -> dict[str, Tensor]:
    """The engine's weights under Hugging Face names (splitting the fused projections), e.g. to
    load them into transformers' model class for a baseline on the very same weights."""
    c = model.config
    q, kv = c.q_size, c.kv_size
    sd = model.state_dict()
    out = {"model.embed_tokens.weight": sd["embed_tokens.weight"], "model.norm.weight": sd["norm.weight"]}
    out["lm_head.weight"] = sd["embed_tokens.weight"] if c.tie_word_embeddings else sd["lm_head.weight"]
    for i in range(c.num_hidden_layers):
        p, e = f"model.layers.{i}.", f"layers.{i}."
        out[p + "input_layernorm.weight"] = sd[e + "input_layernorm.weight"]
        out[p + "post_attention_layernorm.weight"] = sd[e + "post_attention_layernorm.weight"]
        for part, w in zip("qkv", sd[e + "self_attn.qkv_proj.weight"].split((q, kv, kv))):
            out[p + f"self_attn.{part}_proj.weight"] = w
        if c.attention_bias:
            for part, b in zip("qkv", sd[e + "self_attn.qkv_proj.bias"].split((q, kv, kv))):
                out[p + f"self_attn.{part}_proj.bias"] = b
        if c.qk_norm:
            out[p + "self_attn.q_norm.weight"] = sd[e + "self_attn.q_norm.weight"]
            out[p + "self_attn.k_norm.weight"] = sd[e + "self_attn.k_norm.weight"]
        out[p + "self_attn.o_proj.weight"] = sd[e + "self_attn.o_proj.weight"]
        gate, up = sd[e + "mlp.gate_up_proj.weight"].chunk(2)
        out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = gate, up
        out[p + "mlp.down_proj.weight"] = sd[e + "mlp.down_proj.weight"]
    return out


class ModelTooLarge(ValueError):
    """A model whose weights do not fit in the device's free memory (refused before allocating)."""


def check_weights_fit(config: ModelConfig, dtype: torch.dtype, device: str | torch.device) -> None:
    """Refuse, before any allocation, a model whose weights alone exceed the GPU's free memory."""
    device = torch.device(device)
    if device.type != "cuda":
        return
    free, total = torch.cuda.mem_get_info(device)
    need = config.weight_bytes(torch.empty((), dtype=dtype).element_size())
    if need > free:
        raise ModelTooLarge(f"--model {config.name}: its weights take {need / 1e9:.1f} GB in {str(dtype)[6:]}, "
                            f"more than the {free / 1e9:.1f} GB free of the GPU's {total / 1e9:.1f} GB")


def load_checkpoint(path: str | Path, dtype: torch.dtype | str = "float16",
                    device: str | torch.device = "cpu") -> DecoderModel:
    """A model from a Hugging Face checkpoint directory."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a checkpoint directory")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path}: no config.json (a Hugging Face checkpoint directory holds config.json "
                              "and model.safetensors or its shards)")
    try:
        config = ModelConfig.from_json(path)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path / 'config.json'}: not valid JSON ({e})") from None
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path / 'config.json'}: {e}") from None
    check_weights_fit(config, parse_dtype(dtype), device)
    weights = hf_to_engine(config, read_checkpoint(path), source=str(path))
    with torch.device("meta"):
        model = DecoderModel(config).to(parse_dtype(dtype))  # (materialised in the dtype: no float32 copy)
    model = model.to_empty(device=device)
    model.load_state_dict(weights, strict=True)
    model.rotary.build(device)
    return model.to(parse_dtype(dtype)).eval()


def build_random(preset: str | ModelConfig, dtype: torch.dtype | str = "float16",
                 device: str | torch.device = "cpu", seed: int = 0, std: float = 0.02) -> DecoderModel:
    """A model from a preset (or config) with seeded random weights, made directly on `device`."""
    config = get_preset(preset) if isinstance(preset, str) else preset
    check_weights_fit(config, parse_dtype(dtype), device)
    with torch.device("meta"):
        model = DecoderModel(config).to(parse_dtype(dtype))  # (float32 values, rounded once into the dtype)
    model = model.to_empty(device=device)
    model.rotary.build(device)
    model.init_random(seed, std)
    return model.to(parse_dtype(dtype)).eval()


def load_model(source: str, dtype: torch.dtype | str = "float16", device: str | torch.device = "cpu",
               seed: int = 0) -> tuple[DecoderModel, str]:
    """`source` is a preset name or a config.json file (random weights), or a checkpoint
    directory. Returns the model and its weights kind, "random" or "checkpoint"."""
    if Path(source).is_dir():
        return load_checkpoint(source, dtype, device), "checkpoint"
    if Path(source).is_file():
        try:
            config = ModelConfig.from_hf_config(source)
        except ValueError as e:
            raise CheckpointError(f"--model {e}") from None
        return build_random(config, dtype, device, seed), "random"
    if Path(source).exists() or "/" in source:
        raise CheckpointError(f"--model {source}: not a checkpoint directory, config.json or preset name")
    if source not in PRESETS:
        raise CheckpointError(f"--model {source}: unknown model preset (known: {', '.join(PRESETS)}), and no "
                              "checkpoint directory or config.json of that name")
    return build_random(source, dtype, device, seed), "random"
