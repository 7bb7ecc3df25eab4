"""The paged KV cache and the forward pass over a flattened batch of sequences.

The continuous engine puts every scheduled sequence's new tokens through the model in one pass,
flattened into one token batch with no padding: a decode contributes one token, a prompt (or a
prompt chunk on top of cached context) all of its tokens. Each sequence's keys and values live
in fixed-size blocks of a cache shared by all sequences, named by its block table (the block ids
`core.kv.BlockPool` handed out, the scheduler's own numbering).

`PagedKVCache` holds those blocks on the device, one extra block at the end as scratch for the
padding rows of a CUDA graph. `Batch` describes one pass. `forward_eager` is the reference: plain
PyTorch, the eager model's own modules, attention gathered through the block tables; the CPU
tests run it, and the fused Triton path (`engine.paged_fast`) is checked against it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from core.config import ModelConfig
from engine.model import Qwen2


class PagedKVCache:
    """K and V for every layer: `[num_blocks + 1, block_size, kv_heads, head_dim]` each; block
    `num_blocks` is scratch (graph padding rows write there, nothing reads it)."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device | str):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"a paged cache needs at least one block of at least one token, got {num_blocks} "
                             f"blocks of {block_size}")
        shape = (num_blocks + 1, block_size, config.num_key_value_heads, config.head_dim)
        # one allocation for the whole cache, so that "does it fit" is one question to the allocator
        self.storage = torch.zeros((config.num_hidden_layers, 2, *shape), dtype=dtype, device=device)
        self.k = [self.storage[i, 0] for i in range(config.num_hidden_layers)]
        self.v = [self.storage[i, 1] for i in range(config.num_hidden_layers)]
        self.num_blocks, self.block_size = num_blocks, block_size
        self.scratch_slot = num_blocks * block_size  # the first slot of the scratch block

    @staticmethod
    def blocks_that_fit(config: ModelConfig, nbytes: float, block_size: int, dtype: torch.dtype) -> int:
        """How many blocks `nbytes` of device memory hold (the scratch block counted)."""
        per_block = config.kv_bytes_per_token(torch.finfo(dtype).bits // 8) * block_size
        return int(nbytes // per_block) - 1


@dataclass
class Batch:
    """One pass, flattened: sequence s (in batch order: the one-token rows first, `num_decode` of
    them) puts rows `query_start[s] .. query_start[s+1] - 1` through the model, at positions
    `context_lens[s] ..`, its cache in the blocks of `block_tables[s]`; `sample_rows[s]` is the row
    whose logits give its next token. Index tensors on the model's device."""

    tokens: Tensor        # [N] int64
    positions: Tensor     # [N] int64
    slots: Tensor         # [N] int64: block * block_size + offset in the block, where each row's K/V go
    block_tables: Tensor  # [S, max_blocks] int32
    context_lens: Tensor  # [S] int32: tokens cached before this pass
    seq_lens: Tensor      # [S] int32: context + new tokens
    query_start: Tensor   # [S + 1] int32
    sample_rows: Tensor   # [S] int64
    num_decode: int       # the first num_decode sequences put one token each through (rows 0..num_decode-1)
    max_query_len: int

    @property
    def num_seqs(self) -> int:
        return self.context_lens.shape[0]


def attention_eager(q: Tensor, k_cache: Tensor, v_cache: Tensor, batch: Batch) -> Tensor:
    """q [N, heads, D] -> [N, heads * D]: each sequence's rows attend causally over its cached
    positions, gathered through its block table (the reference for the Triton kernels)."""
    N, heads, D = q.shape
    bs, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    k_flat, v_flat = k_cache.view(-1, kv_heads, D), v_cache.view(-1, kv_heads, D)
    out = torch.empty(N, heads * D, dtype=q.dtype, device=q.device)
    starts, contexts = batch.query_start.tolist(), batch.context_lens.tolist()
    for s in range(batch.num_seqs):
        a, b, ctx = starts[s], starts[s + 1], contexts[s]
        n, length = b - a, contexts[s] + b - a
        pos = torch.arange(length, device=q.device)
        slots = batch.block_tables[s, pos // bs].long() * bs + pos % bs
        keys, values = k_flat[slots].transpose(0, 1), v_flat[slots].transpose(0, 1)  # [kv_heads, L, D]
        # the eager model's grouped-query layout: a KV head's query heads folded into the rows
        qg = q[a:b].view(n, kv_heads, group, D).permute(1, 2, 0, 3).reshape(kv_heads, group * n, D)
        query_pos = (ctx + torch.arange(n, device=q.device)).repeat(group)
        mask = pos.view(1, -1) <= query_pos.view(-1, 1)
        o = F.scaled_dot_product_attention(qg, keys, values, attn_mask=mask)
        out[a:b] = o.view(kv_heads, group, n, D).permute(2, 0, 1, 3).reshape(n, heads * D)
    return out


@torch.inference_mode()
def forward_eager(model: Qwen2, cache: PagedKVCache, batch: Batch) -> Tensor:
    """The next token of every sequence of `batch` (greedy), in batch order; keys and values of
    every row written into the cache first. Plain PyTorch, the eager model's own modules."""
    c = model.config
    N = batch.tokens.shape[0]
    h = model.embed_tokens(batch.tokens)
    pos = batch.positions.view(1, N)
    write = batch.slots >= 0
    for i, layer in enumerate(model.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q, k, v = (t[0] for t in attn.project(x.view(1, N, -1), pos, model.rotary))
        slots = batch.slots[write]
        cache.k[i].view(-1, c.num_key_value_heads, c.head_dim)[slots] = k[write]
        cache.v[i].view(-1, c.num_key_value_heads, c.head_dim)[slots] = v[write]
        h = h + attn.o_proj(attention_eager(q, cache.k[i], cache.v[i], batch))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.logits(model.norm(h[batch.sample_rows])).argmax(-1)
