"""Model configuration: the fields of a Hugging Face `config.json` for the decoder families the
engine runs (Qwen2/Qwen2.5, Llama 3.x, Qwen3, Mistral without sliding window), and named presets.

Torch-free, so the simulator and the roofline can read model shapes without the engine installed.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

FAMILIES = ("qwen2", "llama", "qwen3", "mistral")  # Hugging Face model_type values the engine runs


class UnsupportedModel(ValueError):
    """A config.json of an architecture the engine does not run (one line naming the field)."""


@dataclass(frozen=True)
class Llama3Rope:
    """`rope_scaling` of type llama3: long wavelengths divided by `factor`, short ones kept, the
    band between blended (Llama 3.1 and 3.2)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    """A decoder's hyper-parameters, named as in Hugging Face's config.json. The defaults are
    Qwen2.5-1.5B's; the family differences are fields: q/k/v bias (`attention_bias`), an explicit
    `head_dim`, q and k RMSNorm per head (`qk_norm`, Qwen3), llama3 `rope_scaling`, and a tied or
    separate lm_head (`tie_word_embeddings`)."""

    vocab_size: int = 151936
    hidden_size: int = 1536
    intermediate_size: int = 8960
    num_hidden_layers: int = 28
    num_attention_heads: int = 12
    num_key_value_heads: int = 2
    max_position_embeddings: int = 131072
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    bos_token_id: int = 151643
    eos_token_id: int = 151643
    # The context the model is used up to: Qwen2.5-1.5B's model card gives 32,768 tokens
    # (its config allows 131,072 positions). Prompt + new tokens must fit in it.
    context_length: int = 32768
    name: str = "qwen2"
    model_type: str = "qwen2"
    attention_bias: bool = True  # q, k and v projections carry a bias (Qwen2); o_proj never does
    head_dim: int | None = None  # None: hidden_size / num_attention_heads
    qk_norm: bool = False  # RMSNorm over each head of q and k before the rotary (Qwen3)
    rope_scaling: Llama3Rope | None = None

    def __post_init__(self) -> None:
        if self.head_dim is None and isinstance(self.num_attention_heads, int) and self.num_attention_heads > 0 \
                and isinstance(self.hidden_size, int) and self.hidden_size > 0:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                                 f"{self.num_attention_heads}, and no head_dim is given")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        sizes = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "max_position_embeddings", "context_length", "head_dim")
        for name in sizes:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive whole number, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} must be a multiple of "
                             f"num_key_value_heads {self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even (the rotary turns pairs), got {self.head_dim}")
        if not isinstance(self.rope_theta, (int, float)) or isinstance(self.rope_theta, bool) or not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be a positive number, got {self.rope_theta!r}")
        if self.model_type not in FAMILIES:
            raise UnsupportedModel(f"model_type {self.model_type!r}: the engine runs {', '.join(FAMILIES)}")

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def num_parameters(self) -> int:
        """Parameters, counting a tied embedding once."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q, kv = self.q_size, self.kv_size
        attn = h * q + 2 * h * kv + q * h  # q, k, v, o
        if self.attention_bias:
            attn += q + 2 * kv
        if self.qk_norm:
            attn += 2 * self.head_dim
        mlp = 3 * h * i
        per_layer = attn + mlp + 2 * h  # two RMSNorm weights
        lm_head = 0 if self.tie_word_embeddings else v * h
        return v * h + self.num_hidden_layers * per_layer + h + lm_head

    def weight_bytes_read_per_pass(self, dtype_bytes: int = 2) -> int:
        """Bytes of weights one forward pass reads. The lm_head reads the whole vocabulary
        matrix; the embedding lookup reads only one row per token. With tied embeddings that
        matrix is stored once, so this is every parameter once; untied, the embedding table is
        left out."""
        untied_embedding = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return (self.num_parameters - untied_embedding) * dtype_bytes

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        """Bytes the weights take in memory: every parameter once."""
        return self.num_parameters * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V vectors, every layer, every KV head: what one cached token costs."""
        return 2 * dtype_bytes * self.num_hidden_layers * self.num_key_value_heads * self.head_dim

    def _matmul_params(self) -> int:
        h = self.hidden_size
        return self.num_hidden_layers * (2 * h * self.q_size + 2 * h * self.kv_size + 3 * h * self.intermediate_size)

    def flops_per_token(self, context: int = 0) -> float:
        """Forward FLOPs for one token: 2 per weight multiply-add, plus attention over `context`
        earlier positions (QK^T and PV, all query heads)."""
        matmul_params = self._matmul_params() + self.vocab_size * self.hidden_size  # + lm_head
        attn = self.num_hidden_layers * 4 * self.num_attention_heads * self.head_dim * context
        return 2.0 * matmul_params + attn

    def prefill_flops(self, prompt_tokens: int) -> float:
        """FLOPs of a prefill over a fresh prompt: every projection for every token, causal
        attention (each token against itself and all before it), the lm_head for the last token."""
        p = prompt_tokens
        attention = self.num_hidden_layers * 4 * self.num_attention_heads * self.head_dim * p * (p + 1) / 2
        return 2.0 * self._matmul_params() * p + attention + 2.0 * self.vocab_size * self.hidden_size

    @classmethod
    def from_hf_config(cls, source: "dict | str | Path", name: str | None = None) -> "ModelConfig":
        """From a Hugging Face config.json: its dict, the file, or the directory holding it. An
        architecture the engine does not run (mixture of experts, sliding window, multi-head
        latent attention, another model_type, ...) raises UnsupportedModel naming the field."""
        if isinstance(source, (str, Path)):
            path = Path(source)
            if path.is_dir():
                path = path / "config.json"
            if not path.is_file():
                raise FileNotFoundError(f"no config.json at {path}")
            try:
                d = json.loads(path.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ValueError(f"{path}: not valid JSON ({e})") from None
            try:
                where = path.resolve()
                label = where.parent.name if where.name == "config.json" else where.stem
                return replace(cls.from_hf_config(d), name=name or label or "model")
            except ValueError as e:
                raise type(e)(f"{path}: {e}") from None
        return _from_hf_dict(cls, source, name)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """From a Hugging Face config.json dict (as `from_hf_config`)."""
        return cls.from_hf_config(d)

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelConfig":
        """From a config.json file or the directory holding it (as `from_hf_config`)."""
        return cls.from_hf_config(Path(path))

    def to_hf_dict(self) -> dict:
        """As a Hugging Face config.json dict (for writing checkpoints and for transformers)."""
        skip = ("name", "context_length", "model_type", "qk_norm", "rope_scaling")
        d = {k: v for k, v in asdict(self).items() if k not in skip}
        arch = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
                "mistral": "MistralForCausalLM"}[self.model_type]
        d.update(model_type=self.model_type, architectures=[arch], hidden_act="silu", attention_dropout=0.0)
        if self.model_type == "qwen2":
            d.pop("attention_bias")  # Qwen2 always has it
        if self.model_type in ("qwen2", "qwen3"):
            d.update(use_sliding_window=False, sliding_window=None)
        if self.model_type == "mistral":
            d.pop("attention_bias")
            d["sliding_window"] = None
        if self.rope_scaling is not None:
            d["rope_scaling"] = dict(asdict(self.rope_scaling), rope_type="llama3")
        return d


def _refuse(field: str, value, why: str) -> UnsupportedModel:
    return UnsupportedModel(f"config {field} = {json.dumps(value)}: {why}")


# Fields that say a config is of an architecture the engine does not run: (field, why).
_MOE = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size", "num_experts_per_tok")
_MLA = ("kv_lora_rank", "q_lora_rank")


def _from_hf_dict(cls, d: dict, name: str | None) -> ModelConfig:
    if not isinstance(d, dict):
        raise ValueError(f"expected a JSON object of model hyper-parameters, got {type(d).__name__}")
    model_type = d.get("model_type", "qwen2")  # older Qwen2 files written here had none
    for key in _MOE:
        if d.get(key):
            raise _refuse(key, d[key], "mixture of experts; the engine runs dense decoders only")
    for key in _MLA:
        if d.get(key):
            raise _refuse(key, d[key], "multi-head latent attention; the engine runs grouped-query attention only")
    if model_type not in FAMILIES:
        raise _refuse("model_type", model_type, f"the engine runs {', '.join(FAMILIES)}")
    if d.get("use_sliding_window"):
        raise _refuse("use_sliding_window", d["use_sliding_window"], "sliding-window attention is not supported")
    if model_type in ("llama", "mistral") and d.get("sliding_window") is not None:
        raise _refuse("sliding_window", d["sliding_window"], "sliding-window attention is not supported")
    layer_types = d.get("layer_types") or []
    if isinstance(layer_types, list) and any(t != "full_attention" for t in layer_types):
        other = next(t for t in layer_types if t != "full_attention")
        raise _refuse("layer_types", other, "only full attention in every layer is supported")
    if d.get("hidden_act", "silu") != "silu":
        raise _refuse("hidden_act", d["hidden_act"], "the engine's MLP is SwiGLU (silu)")
    if d.get("mlp_bias"):
        raise _refuse("mlp_bias", d["mlp_bias"], "MLP projections with a bias are not supported")
    if d.get("quantization_config") is not None:
        raise _refuse("quantization_config", d["quantization_config"].get("quant_method", "?")
                      if isinstance(d["quantization_config"], dict) else d["quantization_config"],
                      "quantized checkpoints are not supported")

    kwargs = {f.name: d[f.name] for f in fields(cls)
              if f.name in d and d[f.name] is not None
              and f.name not in ("rope_scaling", "attention_bias", "qk_norm", "model_type", "name", "head_dim")}
    if isinstance(kwargs.get("eos_token_id"), list):
        kwargs["eos_token_id"] = kwargs["eos_token_id"][0]
    if isinstance(kwargs.get("bos_token_id"), list):
        kwargs["bos_token_id"] = kwargs["bos_token_id"][0]
    kwargs["model_type"] = model_type
    if "num_key_value_heads" not in kwargs and "num_attention_heads" in kwargs:
        kwargs["num_key_value_heads"] = kwargs["num_attention_heads"]
    if d.get("head_dim") is not None:
        kwargs["head_dim"] = d["head_dim"]
    # Qwen2 puts a bias on q, k and v always (never on o). The others' attention_bias would put one
    # on o_proj too, which the engine does not have.
    if model_type != "qwen2" and d.get("attention_bias"):
        raise _refuse("attention_bias", d["attention_bias"], f"a {model_type} model with biases on q, k, v and o "
                      "is not supported")
    kwargs["attention_bias"] = model_type == "qwen2"
    kwargs["qk_norm"] = model_type == "qwen3"

    # Rotary: rope_theta and rope_scaling (files from transformers 4.x), or rope_parameters (5.x).
    rope = d.get("rope_parameters") if isinstance(d.get("rope_parameters"), dict) else {}
    theta = d.get("rope_theta") if d.get("rope_theta") is not None else rope.get("rope_theta")
    kwargs["rope_theta"] = theta if theta is not None else 10000.0
    scaling = d.get("rope_scaling") if d.get("rope_scaling") is not None else rope
    if not isinstance(scaling, dict):
        raise _refuse("rope_scaling", scaling, "expected an object or null")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "llama3":
        try:
            kwargs["rope_scaling"] = Llama3Rope(float(scaling["factor"]), float(scaling["low_freq_factor"]),
                                                float(scaling["high_freq_factor"]),
                                                int(scaling["original_max_position_embeddings"]))
        except (KeyError, TypeError, ValueError) as e:
            raise _refuse("rope_scaling", scaling, f"a llama3 rope_scaling needs factor, low_freq_factor, "
                          f"high_freq_factor and original_max_position_embeddings ({e})") from None
    elif rope_type not in (None, "default"):
        raise _refuse("rope_scaling.rope_type", rope_type, "the engine's rotary does default and llama3")

    if "tie_word_embeddings" not in kwargs:
        kwargs["tie_word_embeddings"] = True  # transformers' default for configs that do not say
    if "context_length" not in d:
        kwargs["context_length"] = min(kwargs.get("max_position_embeddings", cls.max_position_embeddings),
                                       cls.context_length)
    kwargs["name"] = name or model_type
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ValueError(f"config: {e}") from None


def _llama3(factor: float) -> Llama3Rope:
    return Llama3Rope(factor=factor, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)


# The published config.json's numbers (weights are random: timing does not depend on values). The
# context is the config's positions, at most 32,768, as for any config.json read here.
PRESETS: dict[str, ModelConfig] = {
    # Qwen/Qwen2.5-0.5B.
    "qwen2.5-0.5b": ModelConfig(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                                name="qwen2.5-0.5b"),
    # Qwen/Qwen2.5-1.5B's config.json, exactly.
    "qwen2.5-1.5b": ModelConfig(name="qwen2.5-1.5b"),
    # Qwen/Qwen2.5-7B: untied lm_head.
    "qwen2.5-7b": ModelConfig(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                              num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False,
                              name="qwen2.5-7b"),
    # meta-llama/Llama-3.2-1B: no bias, head_dim 64, tied, llama3 rope scaling by 32.
    "llama-3.2-1b": ModelConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                num_attention_heads=32, num_key_value_heads=8, head_dim=64, rope_theta=500000.0,
                                rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001,
                                model_type="llama", attention_bias=False, rope_scaling=_llama3(32.0),
                                name="llama-3.2-1b"),
    # meta-llama/Llama-3.1-8B: untied, llama3 rope scaling by 8.
    "llama-3.1-8b": ModelConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0, rms_norm_eps=1e-5,
                                tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001,
                                model_type="llama", attention_bias=False, rope_scaling=_llama3(8.0),
                                name="llama-3.1-8b"),
    # Qwen/Qwen3-8B: q and k RMSNorm, no bias, head_dim 128, untied.
    "qwen3-8b": ModelConfig(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                            tie_word_embeddings=False, eos_token_id=151645, model_type="qwen3", attention_bias=False,
                            qk_norm=True, name="qwen3-8b"),
    # Qwen2's architecture, small enough for CPU tests: 2 layers, GQA 4:2, a 1,024-entry vocabulary
    # would cut the tokenizer's ids, so the vocabulary stays full size but the hidden size is 64.
    "tiny": ModelConfig(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                        context_length=8192, name="tiny"),
}


def get_preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}") from None


def is_config_path(name: str) -> bool:
    """Whether `--model name` means a file or directory rather than a preset name."""
    return name not in PRESETS and (Path(name).exists() or "/" in name or name.endswith(".json"))


def resolve_model(name_or_path: str | Path) -> ModelConfig:
    """What `--model` names: a preset, a config.json, or a directory holding one (a checkpoint)."""
    name = str(name_or_path)
    if not name.strip():
        raise ValueError(f"--model is empty; give a preset ({', '.join(PRESETS)}) or a config.json path")
    if name in PRESETS:
        return PRESETS[name]
    path = Path(name)
    if path.is_dir() or path.is_file():
        if path.is_dir() and not (path / "config.json").is_file():
            raise ValueError(f"--model {name}: a directory without a config.json")
        return ModelConfig.from_hf_config(path)
    if is_config_path(name):
        raise ValueError(f"--model {name}: no such file or directory")
    raise ValueError(f"--model {name}: unknown model preset; known: {', '.join(PRESETS)}, or a config.json path")
