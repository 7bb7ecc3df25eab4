"""The model's passes rebuilt from fused Triton kernels, for the GPU.

Same weights, same cache, same function as `Qwen2.forward` (the eager path, which the CPU and CI
run); fewer launches and no host work inside a pass, so the passes can be captured as CUDA graphs
(`engine.cuda_graphs`).

- `decode_b1`: batch 1, five kernels a layer: four matrix-vector products with the small
  operations folded in (`engine.kernels.gemv`) and the attention.
- `decode_small`: batches of 2 up to `small_max` (by default 8 at the 1.5B's widths, else none:
  `SMALL_MAX`), the same five kernels a layer for M rows at once (`engine.kernels.small_m`), each
  weight tile read once for all rows.
- `decode`: any batch; cuBLAS for the projections, one Triton kernel for each step between them
  (residual add + RMSNorm, rotary + cache write, live-context attention, silu * up).
- `prefill`: fresh prompts of one length; as `decode`, with flash attention over the prompt.
`decode_b1`, `decode_small` and `run_layers` (the layer loop of `decode` and `prefill`) take the cache write and
the attention as arguments, so the continuous engine's paged cache (`engine.paged_fast`) runs
the same kernels.
Each returns the greedy next token of every sequence.

Models without q/k/v bias (Llama, Qwen3, Mistral) give the batch-1 kernel a zero bias; Qwen3's
q and k RMSNorm runs between the projection and the rotary (at batch 1 the projection is then a
plain fused-norm GEMV and the rotary the batched rope kernel, as the fused kernel has no norm).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.kernels import gemv as G
from engine.kernels import small_m as S
from engine.kernels.attention import DecodeAttention
from engine.kernels.elementwise import rmsnorm, rope_and_cache, rope_and_paged_cache, silu_mul
from engine.model import DenseKVCache, Qwen2


# The small-batch kernels' tiles: (rows per program, input tile width, warps, splits, pipeline stages),
# the one set `benchmarks/profile_decode.py --small` found best over batches 2..16 on an H200 at the
# 1.5B's widths (results/small-batch). Decode batches 2..SMALL_MAX[hidden size] run on them by default,
# only at the widths where they were measured faster: at the 1.5B's (1536) the step with PDL took
# 0.91x the cuBLAS path's at batch 2, 0.93x at 4, 0.97x at 8, and 1.03x at 16 (slower), in one run.
# At Llama-3.1-8B's (4096) they took 1.11x, 1.15x, 1.22x cuBLAS's step at batch 2, 4, 8 (cuBLAS reads
# its larger matrices at 74-78% of the bandwidth): other widths stay on cuBLAS until measured faster.
# `python -m engine bench --small-batch-max N` (or small_max=N) sets the bound for any model, 1 for none.
SMALL_MAX = {1536: 8}

SMALL_TILES = {"qkv": (32, 256, 4, 4, 3), "o": (32, 128, 4, 4, 3), "gate_up": (32, 128, 4, 1, 3),
               "down": (32, 128, 4, 8, 3), "lm_head": (128, 128, 8, 1, 3)}


class FastPath:
    """The passes of one model, over its own weight tensors (nothing is copied)."""

    def __init__(self, model: Qwen2, b1_tiles: dict | None = None, pdl: bool = False,
                 small_tiles: dict | None = None, small_max: int | None = None):
        c = model.config
        self.model, self.config = model, c
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.eps = c.rms_norm_eps
        self.layers = [(l.input_layernorm.weight, l.self_attn.qkv_proj.weight, l.self_attn.qkv_proj.bias,
                        l.self_attn.o_proj.weight, l.post_attention_layernorm.weight, l.mlp.gate_up_proj.weight,
                        l.mlp.down_proj.weight) for l in model.layers]
        self.embed, self.final_norm, self.lm_head = model.embed_tokens.weight, model.norm.weight, model.lm_head_weight
        # q/k norm (Qwen3): the eager model's own modules, run on the projected q|k|v.
        self.qk_norms = [(l.self_attn.q_norm, l.self_attn.k_norm) for l in model.layers] if c.qk_norm else None
        if c.qk_norm and c.attention_bias:
            raise ValueError("the fused GPU path does not run q/k norm together with a q/k/v bias "
                             "(no family here has both); use --kernels eager (bench: --graphs off)")
        if c.head_dim & (c.head_dim - 1):
            raise ValueError(f"the fused GPU kernels need a power-of-two head_dim, not {c.head_dim}; use --kernels "
                             "eager (bench: --graphs off)")
        # The batch-1 qkv kernel adds a bias; a model without one adds zeros.
        self.zero_bias = None if c.attention_bias else self.embed.new_zeros(c.q_size + 2 * c.kv_size)
        self.cos, self.sin = model.rotary.cos, model.rotary.sin
        # (rows per program, input tile width, warps) of each batch-1 kernel, from
        # benchmarks/profile_decode.py on an H200.
        self.tiles = {"qkv": (2, 512, 2), "o": (8, 2048, 8), "gate_up": (4, 256, 4), "down": (2, 2048, 8),
                      "lm_head": (16, 512, 8)}
        self.tiles.update(b1_tiles or {})
        half = self.head_dim // 2  # a qkv program covers rows in both halves of one head
        self.tiles["qkv"] = (min(self.tiles["qkv"][0], half), *self.tiles["qkv"][1:])
        # (rows per program, input tile width, warps, splits of the input, pipeline stages) of each
        # small-batch kernel (engine.kernels.small_m); benchmarks/profile_decode.py --small sweeps them.
        self.small_tiles = dict(SMALL_TILES)
        self.small_tiles.update(small_tiles or {})
        # batches 2..small_max: small-batch kernels
        self.small_max = SMALL_MAX.get(c.hidden_size, 1) if small_max is None else small_max
        self.workspace = S.Workspace()
        self.pdl = pdl  # programmatic dependent launch for the batch-1 and small-batch kernels (engine.kernels.pdl)
        self.trace: list | None = None  # (label, CUDA event) after each launch, when profiling

    def _mark(self, label: str) -> None:
        if self.trace is not None:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.trace.append((label, event))

    def _qk_norm(self, i: int, qkv: Tensor) -> None:
        """Layer i's q and k RMSNorm (per head, Qwen3), in place on q|k|v [N, (heads + 2 kv_heads) * D]."""
        q_norm, k_norm = self.qk_norms[i]
        qk = qkv[:, :(self.heads + self.kv_heads) * self.head_dim].view(qkv.shape[0], -1, self.head_dim)
        q, k = qk[:, :self.heads], qk[:, self.heads:]
        q.copy_(q_norm(q))
        k.copy_(k_norm(k))

    def _logits(self, hidden: Tensor) -> Tensor:
        """Final norm and lm_head for hidden [N, H]."""
        x = rmsnorm(hidden.contiguous(), self.final_norm, self.eps, torch.empty_like(hidden))
        return F.linear(x, self.lm_head)

    def decode_b1(self, token: Tensor, position: Tensor, k_caches: list[Tensor], v_caches: list[Tensor],
                  attend: Callable[[int, Tensor, Tensor], None], slot: Tensor | None = None) -> Tensor:
        """One decode pass at batch 1. token, position: [1] device buffers, advanced in place (the
        next token replaces the token, the position moves on by one), so a captured graph can be
        replayed step after step with nothing done outside it. Layer i's keys and values go into
        k_caches[i], v_caches[i] (dense at `position`, or paged at flat `slot`), and
        `attend(i, q, out)` computes its attention."""
        t, mark = self.tiles, self._mark
        h = self.embed[token].view(-1)  # a fresh buffer the kernels update in place
        q = torch.empty(self.heads * self.head_dim, dtype=h.dtype, device=h.device)
        attn_out = torch.empty_like(q)
        act = torch.empty(self.config.intermediate_size, dtype=h.dtype, device=h.device)
        mark("embed")
        qkv = None if self.qk_norms is None else h.new_empty(1, self.layers[0][1].shape[0])
        for i, (ln1, w_qkv, b_qkv, w_o, ln2, w_gu, w_down) in enumerate(self.layers):
            if qkv is None:
                G.qkv_rope_cache(w_qkv, self.zero_bias if b_qkv is None else b_qkv, h, ln1, self.eps, position,
                                 self.cos, self.sin, q, k_caches[i], v_caches[i], self.heads, self.kv_heads,
                                 *t["qkv"], pdl=self.pdl, slot=slot)
            else:  # q/k norm between projection and rotary: unfused
                G.gemv(w_qkv, h, qkv.view(-1), norm_weight=ln1, eps=self.eps, rows=t["o"][0], block_k=t["o"][1],
                       warps=t["o"][2], pdl=self.pdl)
                self._qk_norm(i, qkv)
                q1 = q.view(1, self.heads, self.head_dim)
                if slot is None:
                    rope_and_cache(qkv, position, self.cos, self.sin, q1, k_caches[i], v_caches[i], self.heads,
                                   self.kv_heads, 1)
                else:
                    rope_and_paged_cache(qkv, position, slot, self.cos, self.sin, q1, k_caches[i], v_caches[i],
                                         self.heads, self.kv_heads)
            mark("qkv+norm+rope")
            attend(i, q, attn_out)
            mark("attention")
            G.gemv(w_o, attn_out, h, residual=h, rows=t["o"][0], block_k=t["o"][1], warps=t["o"][2], pdl=self.pdl)
            mark("o+residual")
            G.gate_up_silu(w_gu, h, ln2, self.eps, act, *t["gate_up"], pdl=self.pdl)
            mark("gate_up+norm+silu")
            G.gemv(w_down, act, h, residual=h, rows=t["down"][0], block_k=t["down"][1], warps=t["down"][2],
                   pdl=self.pdl)
            mark("down+residual")
        logits = torch.empty(self.lm_head.shape[0], dtype=h.dtype, device=h.device)
        G.gemv(self.lm_head, h, logits, norm_weight=self.final_norm, eps=self.eps,
               rows=t["lm_head"][0], block_k=t["lm_head"][1], warps=t["lm_head"][2], pdl=self.pdl)
        mark("lm_head+norm")
        torch.argmax(logits, dim=-1, keepdim=True, out=token)
        position += 1
        mark("argmax+advance")
        return token

    def uses_small(self, batch: int) -> bool:
        """Whether a decode batch of this size runs `decode_small` (never with Qwen3's q/k norm, which
        its fused qkv kernel does not have)."""
        return 2 <= batch <= self.small_max and self.qk_norms is None

    def decode_small(self, tokens: Tensor, positions: Tensor, k_caches: list[Tensor], v_caches: list[Tensor],
                     attend: Callable[[int, Tensor, Tensor], None], slots: Tensor | None = None) -> Tensor:
        """One decode pass of a small batch, as `decode_b1` row for row: tokens, positions [B]
        device buffers advanced in place; row b's keys and values go into k_caches[i],
        v_caches[i] (dense [B, kv_heads, S, D] at positions[b], or paged at flat slots[b], -1
        writing nothing), and `attend(i, q, out)` computes layer i's attention of q [B, heads * D]
        into out [B, heads * D]."""
        t, mark, ws, pdl = self.small_tiles, self._mark, self.workspace, self.pdl
        B = tokens.shape[0]
        h = self.embed[tokens]  # [B, H], a fresh buffer the kernels update in place
        q = h.new_empty(B, self.heads * self.head_dim)
        attn_out = torch.empty_like(q)
        act = h.new_empty(B, self.config.intermediate_size)
        mark("embed")

        def tile(name):
            rows, block_k, warps, split, stages = t[name]
            return {"rows": rows, "block_k": block_k, "warps": warps, "split": split, "stages": stages,
                    "workspace": ws, "pdl": pdl}

        for i, (ln1, w_qkv, b_qkv, w_o, ln2, w_gu, w_down) in enumerate(self.layers):
            S.qkv_rope_cache(w_qkv, b_qkv, h, ln1, self.eps, positions, self.cos, self.sin, q, k_caches[i],
                             v_caches[i], self.heads, self.kv_heads, slots=slots, **tile("qkv"))
            mark("qkv+norm+rope")
            attend(i, q, attn_out)
            mark("attention")
            S.linear(w_o, attn_out, h, residual=h, **tile("o"))
            mark("o+residual")
            S.gate_up_silu(w_gu, h, ln2, self.eps, act, **tile("gate_up"))
            mark("gate_up+norm+silu")
            S.linear(w_down, act, h, residual=h, **tile("down"))
            mark("down+residual")
        logits = h.new_empty(B, self.lm_head.shape[0])
        S.linear(self.lm_head, h, logits, norm_weight=self.final_norm, eps=self.eps, **tile("lm_head"))
        mark("lm_head+norm")
        torch.argmax(logits, dim=-1, out=tokens)
        positions += 1
        mark("argmax+advance")
        return tokens

    def run_layers(self, h: Tensor, attend: Callable[[int, Tensor], Tensor]) -> Tensor:
        """Every layer over the token rows h [N, H] (updated in place and returned, the last
        block's output added): cuBLAS for the projections, a Triton kernel between each pair.
        `attend(i, qkv)` does layer i's rotary, cache write and attention from the projected
        q|k|v [N, (heads + 2 kv_heads) * D] and returns the attention output [N, heads * D]."""
        mark = self._mark
        x = torch.empty_like(h)
        act = h.new_empty(h.shape[0], self.config.intermediate_size)
        delta = None  # the previous block's output, added to h by the next norm
        for i, (ln1, w_qkv, b_qkv, w_o, ln2, w_gu, w_down) in enumerate(self.layers):
            rmsnorm(h, ln1, self.eps, x, delta)
            mark("residual+norm")
            qkv = F.linear(x, w_qkv, b_qkv)
            if self.qk_norms is not None:
                self._qk_norm(i, qkv)
            mark("qkv")
            o = F.linear(attend(i, qkv), w_o)
            mark("o")
            rmsnorm(h, ln2, self.eps, x, o)
            mark("residual+norm")
            gate_up = F.linear(x, w_gu)
            mark("gate_up")
            silu_mul(gate_up, act)
            mark("silu*up")
            delta = F.linear(act, w_down)
            mark("down")
        h += delta
        return h

    def decode(self, tokens: Tensor, positions: Tensor, cache: DenseKVCache, attention: DecodeAttention) -> Tensor:
        """One decode pass for a batch: tokens, positions [B] device buffers, advanced in place."""
        B, mark = tokens.shape[0], self._mark
        h = self.embed[tokens]
        q = torch.empty(B, self.heads, self.head_dim, dtype=h.dtype, device=h.device)
        attn_out = torch.empty(B, self.heads * self.head_dim, dtype=h.dtype, device=h.device)
        mark("embed")

        def attend(i: int, qkv: Tensor) -> Tensor:
            rope_and_cache(qkv, positions, self.cos, self.sin, q, cache.k[i], cache.v[i], self.heads,
                           self.kv_heads, 1)
            mark("rope+cache write")
            attention(q, cache.k[i], cache.v[i], positions, attn_out)
            mark("attention")
            return attn_out

        h = self.run_layers(h, attend)
        torch.argmax(self._logits(h), dim=-1, out=tokens)
        positions += 1
        mark("norm+lm_head+argmax+advance")
        return tokens

    def prefill(self, tokens: Tensor, cache: DenseKVCache) -> Tensor:
        """The prefill pass of B fresh prompts of one length T: tokens [B, T]."""
        B, T = tokens.shape
        h = self.embed[tokens].view(B * T, -1)
        q = torch.empty(B * T, self.heads, self.head_dim, dtype=h.dtype, device=h.device)
        positions = torch.arange(T, device=h.device).repeat(B)

        def attend(i: int, qkv: Tensor) -> Tensor:
            rope_and_cache(qkv, positions, self.cos, self.sin, q, cache.k[i], cache.v[i], self.heads,
                           self.kv_heads, T)
            attn = _causal_attention(q.view(B, T, self.heads, self.head_dim).transpose(1, 2),
                                     cache.k[i][:, :, :T], cache.v[i][:, :, :T])
            return attn.transpose(1, 2).reshape(B * T, -1)

        h = self.run_layers(h, attend)
        return self._logits(h.view(B, T, -1)[:, -1]).argmax(-1)


def _causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """q [B, heads, T, D], k, v [B, kv_heads, T, D]: causal attention, K/V shared by query groups."""
    group = q.shape[1] // k.shape[1]
    try:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    except TypeError:  # torch < 2.5 has no enable_gqa
        return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                              is_causal=True)
