"""The Llama family of decoders, written here: RMSNorm, rotary embeddings, grouped-query attention,
a SwiGLU MLP and an lm_head. What the families (Qwen2/Qwen2.5, Llama 3.x, Qwen3, Mistral) differ
by are config fields: q/k/v bias (`attention_bias`), the head size (`head_dim`), q and k RMSNorm
per head before the rotary (`qk_norm`, Qwen3), llama3 `rope_scaling` in the rotary tables, and a
tied or separate lm_head (`tie_word_embeddings`).

Projections are stored fused (q|k|v in one matrix, gate|up in another) so a pass launches one
matmul where Hugging Face launches three or two; `engine.weights` fuses a checkpoint's separate
tensors on load. Activations are laid out [batch, tokens, ...] with right padding: sequence b
puts `tokens[b, :n_b]` through the model at positions `positions[b, :n_b]`.

With a `DenseKVCache` each pass writes its keys and values into the cache at their positions and
attends over everything cached up to the query's own position; without one (the naive engine)
it attends only over the tokens it was given.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from core.config import Llama3Rope, ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # In fp32, then back, as Hugging Face does, so fp16 results match theirs.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Rotary(nn.Module):
    """cos/sin tables for every position up to the model's context, built once, in fp32 the way
    Hugging Face computes them (so the angles round identically)."""

    def __init__(self, head_dim: int, theta: float, max_positions: int, scaling: Llama3Rope | None = None):
        super().__init__()
        self.head_dim, self.theta, self.max_positions, self.scaling = head_dim, theta, max_positions, scaling
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)
        self.build()

    def build(self, device: torch.device | str | None = None) -> None:
        """(Re)compute the tables, e.g. after the model was materialised from the meta device."""
        device = device or self.cos.device
        if device == torch.device("meta"):
            return
        dim = self.head_dim
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))
        if self.scaling is not None:
            inv_freq = llama3_inv_freq(inv_freq, self.scaling)
        freqs = torch.outer(torch.arange(self.max_positions, device=device).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate x [B, T, heads, D] by its positions [B, T]."""
        cos = self.cos[positions].to(x.dtype).unsqueeze(2)
        sin = self.sin[positions].to(x.dtype).unsqueeze(2)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin


def llama3_inv_freq(inv_freq: Tensor, s: Llama3Rope) -> Tensor:
    """Llama 3's rotary frequencies: wavelengths longer than the original context / low_freq_factor
    slowed by `factor`, shorter than original / high_freq_factor kept, the band between blended;
    the same float32 operations as transformers' `_compute_llama3_parameters`."""
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class DenseKVCache:
    """Keys and values for `batch` sequences of up to `max_len` positions, one pair of static
    tensors per layer, [batch, kv_heads, max_len, head_dim], updated in place (so a captured CUDA
    graph can write into it)."""

    def __init__(self, config: ModelConfig, batch: int, max_len: int, dtype: torch.dtype,
                 device: torch.device | str):
        shape = (batch, config.num_key_value_heads, max_len, config.head_dim)
        # Zeros, not empty: masked-out garbage could be NaN, and NaN * 0 weight is still NaN.
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.batch, self.max_len = batch, max_len


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, q + 2 * kv, bias=config.attention_bias)
        self.o_proj = nn.Linear(q, config.hidden_size, bias=False)
        if config.qk_norm:  # one RMSNorm over head_dim, shared by every head (Qwen3)
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def project(self, x: Tensor, positions: Tensor, rotary: Rotary) -> tuple[Tensor, Tensor, Tensor]:
        """q [B, T, heads, D], k and v [B, T, kv_heads, D] of x [B, T, H]: projected, q and k
        normed per head when the model does that, then rotated to their positions [B, T]."""
        B, T, _ = x.shape
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        q, k, v = self.qkv_proj(x).split((q_size, kv_size, kv_size), dim=-1)
        q = q.view(B, T, self.heads, self.head_dim)
        k = k.view(B, T, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return rotary(q, positions), rotary(k, positions), v.view(B, T, self.kv_heads, self.head_dim)

    def forward(self, x: Tensor, positions: Tensor, rotary: Rotary, cache: DenseKVCache | None,
                layer: int, kv_len: int, mask: Tensor | None) -> Tensor:
        """mask None: every row holds positions 0..T-1 (a fresh, unpadded prompt), so attention
        is plainly causal over the tokens given. Otherwise `mask` [B, 1, group*T, S] says which
        of the first S cache positions each (query head in group, token) may see."""
        B, T, _ = x.shape
        q_size = self.heads * self.head_dim
        q, k, v = self.project(x, positions, rotary)
        if cache is not None:
            rows = torch.arange(B, device=x.device).unsqueeze(1).expand(B, T)
            cache.k[layer][rows, :, positions] = k
            cache.v[layer][rows, :, positions] = v

        group = self.heads // self.kv_heads
        if mask is None:
            keys = k.transpose(1, 2).repeat_interleave(group, dim=1)
            values = v.transpose(1, 2).repeat_interleave(group, dim=1)
            out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, is_causal=True)
            return self.o_proj(out.transpose(1, 2).reshape(B, T, q_size))

        if cache is not None:
            keys, values = cache.k[layer][:, :, :kv_len], cache.v[layer][:, :, :kv_len]
        else:
            keys, values = k.transpose(1, 2), v.transpose(1, 2)
        # Grouped-query attention without copying K/V: the query heads that share a KV head are
        # folded into the query-length axis, [B, kv_heads, group * T, D].
        qg = q.view(B, T, self.kv_heads, group, self.head_dim).permute(0, 2, 3, 1, 4)
        qg = qg.reshape(B, self.kv_heads, group * T, self.head_dim)
        out = F.scaled_dot_product_attention(qg, keys, values, attn_mask=mask)
        out = out.view(B, self.kv_heads, group, T, self.head_dim).permute(0, 3, 1, 2, 4)
        return self.o_proj(out.reshape(B, T, q_size))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)


class DecoderModel(nn.Module):
    """Qwen2ForCausalLM, LlamaForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, as the config
    says. `forward` returns the final hidden states; `logits` applies the lm_head (tied or not) to
    the rows you ask for (the engines ask only for each sequence's last token)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = Rotary(config.head_dim, config.rope_theta, config.context_length, config.rope_scaling)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @property
    def lm_head_weight(self) -> Tensor:
        return self.embed_tokens.weight if self.config.tie_word_embeddings else self.lm_head.weight

    def forward(self, tokens: Tensor, positions: Tensor, cache: DenseKVCache | None = None,
                kv_len: int | None = None, causal: bool = False) -> Tensor:
        """tokens, positions: [B, T], right-padded. With a cache, keys/values are written at
        `positions` and attention spans cache positions [0, kv_len) (default: up to the largest
        position + 1), each query seeing only positions up to its own. `causal=True` promises
        that every row is a fresh prompt at positions 0..T-1 with no padding, which takes the
        plain causal path (no mask; flash attention on a GPU)."""
        B, T = tokens.shape
        mask = None
        if not causal:
            if cache is not None:
                kv_len = kv_len or int(positions.max()) + 1
                key_pos = torch.arange(kv_len, device=tokens.device)
            else:
                key_pos = torch.arange(T, device=tokens.device)
            group = self.config.num_attention_heads // self.config.num_key_value_heads
            mask = (key_pos.view(1, 1, 1, -1) <= positions.view(B, 1, T, 1)).repeat(1, 1, group, 1)
        h = self.embed_tokens(tokens)
        for i, layer in enumerate(self.layers):
            h = h + layer.self_attn(layer.input_layernorm(h), positions, self.rotary, cache, i, kv_len, mask)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.norm(h)

    def logits(self, hidden: Tensor) -> Tensor:
        return F.linear(hidden, self.lm_head_weight)

    @torch.no_grad()
    def init_random(self, seed: int = 0, std: float = 0.02) -> "DecoderModel":
        """Seeded random weights (timing does not depend on values): N(0, std) matrices, output
        projections scaled down by depth so activations stay finite in fp16, norms at 1. Tests
        use a larger std so that the layers, not the embedding, decide the next token."""
        device = self.embed_tokens.weight.device
        gen = torch.Generator(device=device).manual_seed(seed)
        depth_scale = 1.0 / math.sqrt(2 * self.config.num_hidden_layers)
        for name, p in self.named_parameters():
            if name.endswith(("layernorm.weight", "_norm.weight")) or name == "norm.weight":
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32) * std)
            else:
                scale = std * (depth_scale if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0)
                p.copy_(torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32) * scale)
        return self


Qwen2 = DecoderModel  # the name the engine's modules have always used
