"""The continuous engine's passes on the fused Triton kernels, over the paged KV cache.

The same kernels as the static engine's fast path (`engine.fast_path`), with the cache write and
the attention of the paged cache plugged in: rotary + a write at each token's slot, split-K
decode attention through block tables for the sequences that decode, flash-style chunk
attention for prompts and prompt chunks (on top of cached context), both in one pass when it is
mixed. `forward` launches a pass kernel by kernel (any pass); decode passes replay CUDA graphs
captured at padded batch buckets (1, 2, 4, then multiples of 8, as vLLM), largest first into one
memory pool, batch 1 on the fused batch-1 kernels, batches 2..`small_max` (`fast_path.SMALL_MAX`) on their
small-batch form. Prefill and mixed passes of up to 8,192
tokens replay graphs too, their tokens padded to a power of two and their sequences to one
(chunk attention for every row, a decode being a one-token chunk): on a slow host the hundreds of
launches of such a pass cost more than the GPU's work. A graph's inputs are static buffers the
host fills before each replay; its padding rows write nothing into the cache and attend to
nothing, its padding sequences own no rows.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from engine.buckets import PREFILL_GRAPH_TOKENS, bucket_of, graph_buckets, powers_of_two  # noqa: F401 (re-exported)
from engine.cuda_graphs import _Graph
from engine.fast_path import FastPath
from engine.host_buffers import Uploads
from engine.kernels.attention import PagedDecodeAttention
from engine.kernels.elementwise import rope_and_paged_cache
from engine.kernels.pdl import pdl_available
from engine.kernels.prefill_attention import chunk_attention
from engine.model import Qwen2
from engine.paged import Batch, PagedKVCache


class PagedFastPath:
    """Passes of one model over one paged cache, for batches of up to `max_batch` sequences."""

    def __init__(self, model: Qwen2, cache: PagedKVCache, max_batch: int, graphs: bool = False,
                 b1_tiles: dict | None = None, static_decode: bool = False, small_tiles: dict | None = None,
                 small_max: int | None = None):
        """graphs: capture the decode passes as CUDA graphs; static_decode: run them through the
        same static buffers without capturing (the CPU tests of the graph path's inputs)."""
        c = model.config
        self.cache, self.config, self.max_batch = cache, c, max_batch
        self.device = model.embed_tokens.weight.device
        pdl = graphs and pdl_available() and torch.cuda.get_device_capability()[0] >= 9
        self.fast = FastPath(model, b1_tiles, pdl, small_tiles, small_max)
        max_len = min(c.context_length, cache.num_blocks * cache.block_size)
        shape = (c.num_attention_heads, c.num_key_value_heads, c.head_dim, max_len, cache.block_size, self.device)
        self.attention = PagedDecodeAttention(max_batch, *shape)
        self.attention_b1 = PagedDecodeAttention(1, *shape, pdl=pdl)  # in the batch-1 kernels' PDL chain
        small = min(max_batch, self.fast.small_max)  # and the small-batch kernels'
        self.attention_small = PagedDecodeAttention(small, *shape, pdl=pdl) if small >= 2 else None
        self.buckets = graph_buckets(max_batch)
        self.token_buckets = powers_of_two(32, PREFILL_GRAPH_TOKENS)
        self.seq_buckets = powers_of_two(1, max_batch)
        self.uploads = Uploads(self.device, torch.int64)
        self.graphs: dict[int, _Graph] = {}
        self.prefill_graphs: dict[tuple[int, int], _Graph] = {}
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
        """Static input buffers for the largest shapes, and a graph per bucket, largest first,
        sharing one memory pool (with `use_graphs` False, the same steps run uncaptured)."""
        n, dev = self.max_batch, self.device
        width = -(-min(self.config.context_length, self.cache.num_blocks * self.cache.block_size) // self.cache.block_size)
        self.s_tokens = torch.zeros(n, dtype=torch.long, device=dev)
        self.s_positions = torch.zeros(n, dtype=torch.long, device=dev)
        self.s_slots = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.s_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.s_tables = torch.zeros((n, width), dtype=torch.int32, device=dev)
        self.s_out = torch.zeros(n, dtype=torch.long, device=dev)
        tokens, seqs = self.token_buckets[-1], self.seq_buckets[-1]
        self.p_tokens = torch.zeros(tokens, dtype=torch.long, device=dev)
        self.p_positions = torch.zeros(tokens, dtype=torch.long, device=dev)
        self.p_slots = torch.full((tokens,), -1, dtype=torch.long, device=dev)
        self.p_tables = torch.zeros((seqs, width), dtype=torch.int32, device=dev)
        self.p_query_start = torch.zeros(seqs + 1, dtype=torch.int32, device=dev)
        self.p_context = torch.zeros(seqs, dtype=torch.int32, device=dev)
        self.p_sample = torch.zeros(seqs, dtype=torch.long, device=dev)
        self.p_out = torch.zeros(seqs, dtype=torch.long, device=dev)
        pool = torch.cuda.graph_pool_handle() if use_graphs else None
        for t in sorted(self.token_buckets, reverse=True):
            for q in sorted((q for q in self.seq_buckets if q <= t), reverse=True):
                self.prefill_graphs[t, q] = _Graph(lambda t=t, q=q: self.prefill_step(t, q), use_graphs, pool)
        for b in sorted(self.buckets, reverse=True):
            self.graphs[b] = _Graph(lambda b=b: self.decode_step(b), use_graphs, pool)
        if use_graphs:
            torch.cuda.synchronize()
        self.mode = "graph" if use_graphs else "static"

    def prefill_step(self, t: int, q: int) -> Tensor:
        """A prefill or mixed pass of the first t rows and q sequences of the static buffers
        (captured as a graph): chunk attention for every row."""
        c = self.config
        h = self.fast.embed[self.p_tokens[:t]]
        qs = torch.empty(t, c.num_attention_heads, c.head_dim, dtype=h.dtype, device=h.device)
        out = torch.empty(t, c.num_attention_heads * c.head_dim, dtype=h.dtype, device=h.device)
        chunk = (self.p_query_start[:q + 1], self.p_context[:q], t)
        h = self.fast.run_layers(h, lambda i, qkv: self.attend(i, qkv, qs, out, self.p_positions[:t], self.p_slots[:t],
                                                               self.p_tables[:q], None, 0, chunk))
        torch.argmax(self.fast._logits(h[self.p_sample[:q]]), dim=-1, out=self.p_out[:q])
        return self.p_out

    def decode_step(self, b: int) -> Tensor:
        """The decode pass of the first b rows of the static buffers (captured as a graph)."""
        c, k, v = self.config, self.cache.k, self.cache.v
        if b == 1:
            attend = lambda i, q, out: self.attention_b1(q.view(1, c.num_attention_heads, c.head_dim), k[i], v[i],  # noqa: E731
                                                         self.s_tables, self.s_lens, out.view(1, -1), batch=1)
            token = self.fast.decode_b1(self.s_tokens[:1], self.s_positions[:1], k, v, attend, slot=self.s_slots[:1])
            self.s_out[:1].copy_(token)
            return self.s_out
        if self.fast.uses_small(b):
            shape = (b, c.num_attention_heads, c.head_dim)
            attend = lambda i, q, out: self.attention_small(q.view(shape), k[i], v[i], self.s_tables[:b],  # noqa: E731
                                                            self.s_lens[:b], out, batch=b)
            token = self.fast.decode_small(self.s_tokens[:b], self.s_positions[:b], k, v, attend,
                                           slots=self.s_slots[:b])
            self.s_out[:b].copy_(token)
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

    def can_replay_prefill(self, host) -> bool:
        return bool(self.prefill_graphs) and len(host.tokens) <= self.token_buckets[-1] and \
            host.num_seqs <= self.seq_buckets[-1]

    def bucket(self, batch: int) -> int:
        return next(b for b in self.buckets if b >= batch)

    def stage(self, parts: list[np.ndarray]) -> list[Tensor]:
        """Host arrays onto the device in one copy (from reused pinned memory on a GPU): their views."""
        return self.uploads.upload(parts)

    @staticmethod
    def take_previous(tokens: Tensor, index: Tensor, previous: Tensor | None) -> None:
        """Rows whose token is the previous pass's sample, still on the GPU: `index` holds the
        rows, then the rows of the previous pass's samples."""
        if index.numel():
            half = index.numel() // 2
            tokens[index[:half]] = previous[index[half:]]

    def replay_decode(self, host, previous: Tensor | None) -> tuple[Tensor, str, int]:
        """Fill the static buffers with a decode pass's rows (padding after them), take the tokens
        still on the GPU from the previous pass's samples, replay the bucket's graph. Returns the
        sampled tokens (a view of the static output: read it before the next replay), the mode
        and the padded batch."""
        B = host.num_seqs
        b = bucket_of(B, self.buckets)
        width = host.block_tables.shape[1]
        pad = np.zeros(b - B, np.int64)
        tokens, positions, slots, lens, tables, index = self.stage([
            np.concatenate([host.tokens, pad]), np.concatenate([host.positions, pad]),
            np.concatenate([host.slots, pad - 1]), np.concatenate([host.seq_lens, pad]), host.block_tables.ravel(),
            np.concatenate(host.from_previous)])
        self.s_tokens[:b].copy_(tokens)
        self.s_positions[:b].copy_(positions)
        self.s_slots[:b].copy_(slots)
        self.s_lens[:b].copy_(lens)
        self.s_tables[:B, :width].copy_(tables.view(B, width))
        self.take_previous(self.s_tokens, index, previous)
        sampled = self.graphs[b]()
        return sampled[:B], self.mode, b

    def replay_prefill(self, host, previous: Tensor | None) -> tuple[Tensor, str, int]:
        """The same for a prefill or mixed pass: rows padded to a power of two (padding rows
        belong to no sequence), sequences too (padding sequences own no rows)."""
        N, S = len(host.tokens), host.num_seqs
        t, q = bucket_of(N, self.token_buckets), bucket_of(S, self.seq_buckets)
        width = host.block_tables.shape[1]
        rows, seqs = np.zeros(t - N, np.int64), np.zeros(q - S, np.int64)
        tokens, positions, slots, tables, starts, context, sample, index = self.stage([
            np.concatenate([host.tokens, rows]), np.concatenate([host.positions, rows]),
            np.concatenate([host.slots, rows - 1]), host.block_tables.ravel(),
            np.concatenate([host.query_start, seqs + N]), np.concatenate([host.context_lens, seqs]),
            np.concatenate([host.sample_rows, seqs]), np.concatenate(host.from_previous)])
        self.p_tokens[:t].copy_(tokens)
        self.p_positions[:t].copy_(positions)
        self.p_slots[:t].copy_(slots)
        self.p_tables[:S, :width].copy_(tables.view(S, width))
        self.p_query_start[:q + 1].copy_(starts)
        self.p_context[:q].copy_(context)
        self.p_sample[:q].copy_(sample)
        self.take_previous(self.p_tokens, index, previous)
        sampled = self.prefill_graphs[t, q]()
        return sampled[:S], self.mode, t
