"""Model configuration: the fields of a Hugging Face Qwen2 `config.json`, and named presets.

Torch-free, so the simulator and the roofline can read model shapes without the engine installed.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path


@dataclass(frozen=True)
class ModelConfig:
    """The Qwen2 architecture's hyper-parameters, named as in Hugging Face's config.json."""

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

    def __post_init__(self) -> None:
        sizes = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "max_position_embeddings", "context_length")
        for name in sizes:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive whole number, got {value!r}")
        if self.hidden_size % self.num_attention_heads or self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"hidden_size {self.hidden_size}, num_attention_heads {self.num_attention_heads} and "
                             f"num_key_value_heads {self.num_key_value_heads} must divide each other in that order")
        if not isinstance(self.rope_theta, (int, float)) or not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be a positive number, got {self.rope_theta!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_parameters(self) -> int:
        """Parameters, counting the tied embedding once."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        kv = self.num_key_value_heads * self.head_dim
        attn = h * h + h + 2 * (h * kv + kv) + h * h  # q (+bias), k, v (+bias), o
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

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V vectors, every layer, every KV head: what one cached token costs."""
        return 2 * dtype_bytes * self.num_hidden_layers * self.num_key_value_heads * self.head_dim

    def flops_per_token(self, context: int = 0) -> float:
        """Forward FLOPs for one token: 2 per weight multiply-add, plus attention over `context`
        earlier positions (QK^T and PV, all query heads)."""
        h = self.hidden_size
        kv = self.num_key_value_heads * self.head_dim
        matmul_params = self.num_hidden_layers * (2 * h * h + 2 * h * kv + 3 * h * self.intermediate_size)
        matmul_params += self.vocab_size * h  # lm_head
        attn = self.num_hidden_layers * 4 * self.num_attention_heads * self.head_dim * context
        return 2.0 * matmul_params + attn

    def prefill_flops(self, prompt_tokens: int) -> float:
        """FLOPs of a prefill over a fresh prompt: every projection for every token, causal
        attention (each token against itself and all before it), the lm_head for the last token."""
        h, p = self.hidden_size, prompt_tokens
        kv = self.num_key_value_heads * self.head_dim
        matmul_params = self.num_hidden_layers * (2 * h * h + 2 * h * kv + 3 * h * self.intermediate_size)
        attention = self.num_hidden_layers * 4 * self.num_attention_heads * self.head_dim * p * (p + 1) / 2
        return 2.0 * matmul_params * p + attention + 2.0 * self.vocab_size * h

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """From a Hugging Face config.json dict; unknown keys are ignored."""
        if not isinstance(d, dict):
            raise ValueError(f"expected a JSON object of model hyper-parameters, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known and v is not None}
        if isinstance(kwargs.get("eos_token_id"), list):
            kwargs["eos_token_id"] = kwargs["eos_token_id"][0]
        if d.get("model_type") not in (None, "qwen2"):
            raise ValueError(f"config model_type is {d.get('model_type')!r}; this engine implements 'qwen2'")
        if "head_dim" in d and d["head_dim"] != d.get("hidden_size", cls.hidden_size) // d.get(
                "num_attention_heads", cls.num_attention_heads):
            raise ValueError("config head_dim differs from hidden_size / num_attention_heads; not a Qwen2 layout")
        if "context_length" not in d:
            kwargs["context_length"] = min(kwargs.get("max_position_embeddings", cls.max_position_embeddings),
                                           cls.context_length)
        return cls(**kwargs)

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json at {path}")
        return replace(cls.from_dict(json.loads(path.read_text())), name=path.parent.name)

    def to_hf_dict(self) -> dict:
        """As a Hugging Face config.json dict (for writing checkpoints and for transformers)."""
        d = {k: v for k, v in asdict(self).items() if k not in ("name", "context_length")}
        d.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_act="silu",
                 use_sliding_window=False, sliding_window=None, attention_dropout=0.0)
        return d


PRESETS: dict[str, ModelConfig] = {
    # Qwen/Qwen2.5-1.5B's config.json, exactly.
    "qwen2.5-1.5b": ModelConfig(name="qwen2.5-1.5b"),
    # Same architecture, small enough for CPU tests: 2 layers, GQA 4:2, a 1,024-entry vocabulary
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
