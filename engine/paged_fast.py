"""The continuous engine's passes on the fused Triton kernels, over the paged KV cache.

The same kernels as the static engine's fast path (`engine.fast_path`), with the cache write and
the attention of the paged cache plugged in: rotary + a write at each token's slot, split-K
decode attention through block tables for the sequences that decode, flash-style chunk
attention for prompts and prompt chunks (on top of cached context), both in one pass when it is
mixed. `forward` launches a pass kernel by kernel (any pass); decode passes replay CUDA graphs
captured at padded batch buckets (1, 2, 4, then multiples of 8, as vLLM), largest first into one
memory pool, batch 1 on the fused batch-1 kernels. A graph's inputs are static buffers the host
fills before each replay; its padding rows write nothing into the cache and attend to nothing.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from engine.cuda_graphs import _Graph
from engine.fast_path import FastPath
from engine.kernels.attention import PagedDecodeAttention
from engine.kernels.elementwise import rope_and_paged_cache
from engine.kernels.pdl import pdl_available
from engine.kernels.prefill_attention import chunk_attention
from engine.model import Qwen2
from engine.paged import Batch, PagedKVCache


def graph_buckets(max_batch: int) -> list[int]:
    """Padded decode batch sizes a CUDA graph is captured for: 1, 2, 4, then every multiple of
    8 up to `max_batch` (vLLM's buckets), and `max_batch` itself."""
    sizes = [b for b in (1, 2, 4) if b < max_batch] + list(range(8, max_batch, 8)) + [max_batch]
    return sorted(set(sizes))


class PagedFastPath:
    """Passes of one model over one paged cache, for batches of up to `max_batch` sequences."""

    def __init__(self, model: Qwen2, cache: PagedKVCache, max_batch: int, graphs: bool = False,
                 b1_tiles: dict | None = None, static_decode: bool = False):
        """graphs: capture the decode passes as CUDA graphs; static_decode: run them through the
        same static buffers without capturing (the CPU tests of the graph path's inputs)."""
        c = model.config
        self.cache, self.config, self.max_batch = cache, c, max_batch
        self.device = model.embed_tokens.weight.device
        pdl = graphs and pdl_available() and torch.cuda.get_device_capability()[0] >= 9
        self.fast = FastPath(model, b1_tiles, pdl)
        max_len = min(c.context_length, cache.num_blocks * cache.block_size)
        shape = (c.num_attention_heads, c.num_key_value_heads, c.head_dim, max_len, cache.block_size, self.device)
        self.attention = PagedDecodeAttention(max_batch, *shape)
        self.attention_b1 = PagedDecodeAttention(1, *shape, pdl=pdl)  # in the batch-1 kernels' PDL chain
        self.buckets = graph_buckets(max_batch)
        self.graphs: dict[int, _Graph] = {}
        if graphs or static_decode:
            self.capture(graphs)

    # ------------------------------------------------------------------ any pass

    def attend(self, i: int, qkv: Tensor, q: Tensor, out: Tensor, positions: Tensor, slots: Tensor,
               block_tables: Tensor, seq_lens: Tensor, num_decode: int, chunk: tuple | None = None) -> Tensor:
        """Layer i's rotary and cache write for every row, decode attention for the first
        `num_decode` rows (one a sequence), chunk attention for the rest (`chunk`: the chunk
        sequences' query starts from 0, their context lengths, the longest chunk)."""
        c, k, v = self.config, self.cache.k[i], self.cache.v[i]
        rope_and_paged_cache(qkv, positions, slots, self.fast.cos, self.fast.sin, q, k, v, c.num_attention_heads,
                             c.num_key_value_heads)
        self.fast._mark("rope+cache write")
        if num_decode:
            self.attention(q[:num_decode], k, v, block_tables[:num_decode], seq_lens[:num_decode], out[:num_decode],
                           batch=num_decode)
        if chunk is not None:
            query_start, context_lens, longest = chunk
            chunk_attention(q[num_decode:], k, v, block_tables[num_decode:], query_start, context_lens,
                            out[num_decode:], longest)
        self.fast._mark("attention")
        return out

    def forward(self, batch: Batch) -> Tensor:
        """One pass launched kernel by kernel: the next token of every sequence (batch order)."""
        c = self.config
        N, nd = batch.tokens.shape[0], batch.num_decode
        h = self.fast.embed[batch.tokens]
        q = torch.empty(N, c.num_attention_heads, c.head_dim, dtype=h.dtype, device=h.device)
        out = torch.empty(N, c.num_attention_heads * c.head_dim, dtype=h.dtype, device=h.device)
        chunk = None
        if N > nd:
            chunk = (batch.query_start[nd:] - nd, batch.context_lens[nd:], batch.max_query_len)
        h = self.fast.run_layers(h, lambda i, qkv: self.attend(i, qkv, q, out, batch.positions, batch.slots,
                                                               batch.block_tables, batch.seq_lens, nd, chunk))
        return self.fast._logits(h[batch.sample_rows]).argmax(-1)

    # ------------------------------------------------------------------ decode passes as CUDA graphs

    def capture(self, use_graphs: bool = True) -> None:
        """Static input buffers for the largest bucket, and a graph per bucket, largest first,
        sharing one memory pool (with `use_graphs` False, the same steps run uncaptured)."""
        n, width = self.max_batch, -(-min(self.config.context_length, self.cache.num_blocks * self.cache.block_size)
                                     // self.cache.block_size)
        dev = self.device
        self.s_tokens = torch.zeros(n, dtype=torch.long, device=dev)
        self.s_positions = torch.zeros(n, dtype=torch.long, device=dev)
        self.s_slots = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.s_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.s_tables = torch.zeros((n, width), dtype=torch.int32, device=dev)
        self.s_out = torch.zeros(n, dtype=torch.long, device=dev)
        pool = torch.cuda.graph_pool_handle() if use_graphs else None
        for b in sorted(self.buckets, reverse=True):
            self.graphs[b] = _Graph(lambda b=b: self.decode_step(b), use_graphs, pool)
        if use_graphs:
            torch.cuda.synchronize()
        self.mode = "graph" if use_graphs else "static"

    def decode_step(self, b: int) -> Tensor:
        """The decode pass of the first b rows of the static buffers (captured as a graph)."""
        c, k, v = self.config, self.cache.k, self.cache.v
        if b == 1:
            attend = lambda i, q, out: self.attention_b1(q.view(1, c.num_attention_heads, c.head_dim), k[i], v[i],  # noqa: E731
                                                         self.s_tables, self.s_lens, out.view(1, -1), batch=1)
            token = self.fast.decode_b1(self.s_tokens[:1], self.s_positions[:1], k, v, attend, slot=self.s_slots[:1])
            self.s_out[:1].copy_(token)
            return self.s_out
        h = self.fast.embed[self.s_tokens[:b]]
        q = torch.empty(b, c.num_attention_heads, c.head_dim, dtype=h.dtype, device=h.device)
        out = torch.empty(b, c.num_attention_heads * c.head_dim, dtype=h.dtype, device=h.device)
        h = self.fast.run_layers(h, lambda i, qkv: self.attend(i, qkv, q, out, self.s_positions[:b], self.s_slots[:b],
                                                               self.s_tables, self.s_lens, b))
        torch.argmax(self.fast._logits(h), dim=-1, out=self.s_out[:b])
        return self.s_out

    def can_replay(self, host) -> bool:
        return bool(self.graphs) and host.num_decode == host.num_seqs <= self.max_batch

    def bucket(self, batch: int) -> int:
        return next(b for b in self.buckets if b >= batch)

    def replay_decode(self, host, previous: Tensor | None) -> tuple[Tensor, str, int]:
        """Fill the static buffers with a decode pass's rows (padding after them), take the tokens
        still on the GPU from the previous pass's samples, replay the bucket's graph. Returns the
        sampled tokens (a view of the static output: read it before the next replay), the mode
        and the padded batch."""
        B = host.num_seqs
        b = self.bucket(B)
        width = host.block_tables.shape[1]
        rows, src = host.from_previous
        staged = np.zeros(4 * b + B * width + 2 * len(rows), np.int64)
        staged[:B] = host.tokens
        staged[b:b + B] = host.positions
        staged[2 * b:3 * b] = -1
        staged[2 * b:2 * b + B] = host.slots
        staged[3 * b:3 * b + B] = host.seq_lens
        staged[4 * b:4 * b + B * width] = host.block_tables.ravel()
        staged[4 * b + B * width:] = np.concatenate([rows, src])
        dev = torch.from_numpy(staged)
        if self.device.type == "cuda":
            dev = dev.pin_memory().to(self.device, non_blocking=True)
        self.s_tokens[:b].copy_(dev[:b])
        self.s_positions[:b].copy_(dev[b:2 * b])
        self.s_slots[:b].copy_(dev[2 * b:3 * b])
        self.s_lens[:b].copy_(dev[3 * b:4 * b])
        self.s_tables[:B, :width].copy_(dev[4 * b:4 * b + B * width].view(B, width))
        if len(rows):
            idx = dev[4 * b + B * width:]
            self.s_tokens[idx[:len(rows)]] = previous[idx[len(rows):]]
        sampled = self.graphs[b]()
        return sampled[:B], self.mode, b
