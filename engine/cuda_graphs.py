"""Decode (and fixed-shape prefill) replayed as CUDA graphs.

On the H200 the host is slow: launching a pass's ~150-300 kernels one by one from Python costs
more than the GPU's work. A CUDA graph records the launches of one pass once and replays them with
a single call. Graphs need fixed memory, so the decoder owns the KV cache and static input buffers
for one (batch size, cache length) at a time, captured the first time that shape is asked for
(nano-vllm captures per batch-size bucket up front; a closed benchmark asks for one shape many
times, so capturing on first use is enough here). Each graph keeps its own memory pool: graphs
sharing one may hand each other's live outputs out as scratch.

`use_graphs=False` runs the very same kernels without capture: the GPU test compares the two.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from engine.fast_path import FastPath
from engine.kernels.attention import DecodeAttention
from engine.kernels.pdl import pdl_available
from engine.model import DenseKVCache, Qwen2

PREFILL_GRAPH_TOKENS = 32768  # larger prefills launch few, long kernels: no graph needed


class _Graph:
    """One captured callable with its static inputs and output."""

    def __init__(self, fn: Callable[[], Tensor], use_graphs: bool, pool=None):
        self.fn, self.graph = fn, None
        if not use_graphs:
            return
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm up: compile Triton kernels, create cuBLAS handles
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        # captured on the stream it warmed up on: a fresh capture stream can make cuBLAS set up its
        # workspace for that stream mid-capture, which failed one capture on an H200 (EXECUTION_FAILED)
        with torch.cuda.graph(self.graph, pool=pool, stream=stream):
            self.out = fn()

    def __call__(self) -> Tensor:
        if self.graph is None:
            return self.fn()
        self.graph.replay()
        return self.out


class GraphDecoder:
    """Owns the cache and the graphs for the shape in use; `engine.engines.generate` calls
    `cache`, then `prefill`, then `start` and `step` once per token."""

    def __init__(self, model: Qwen2, use_graphs: bool = True, b1_tiles: dict | None = None,
                 pdl: bool | None = None, small_tiles: dict | None = None, small_max: int | None = None):
        if use_graphs and model.embed_tokens.weight.device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device (use_graphs=False runs the kernels "
                             "without them, e.g. in Triton's CPU interpreter)")
        self.model, self.use_graphs = model, use_graphs
        if pdl is None:  # on by default where the GPU (Hopper or newer) and Triton support it
            pdl = use_graphs and pdl_available() and torch.cuda.get_device_capability()[0] >= 9
        self.fast = FastPath(model, b1_tiles, pdl, small_tiles, small_max)
        self.shape: tuple[int, int] | None = None
        self._cache: DenseKVCache | None = None
        self._prefills: dict[tuple[int, int], _Graph] = {}

    def cache(self, batch: int, max_len: int) -> DenseKVCache:
        """The KV cache for `batch` sequences of up to `max_len` positions; capturing the decode
        graph for that shape the first time it is asked for."""
        if self.shape != (batch, max_len):
            self._prefills.clear()
            self._decode = self._cache = None
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            device, c = self.model.embed_tokens.weight.device, self.model.config
            self._cache = DenseKVCache(c, batch, max_len, self.model.embed_tokens.weight.dtype, device)
            self.tokens = torch.zeros(batch, dtype=torch.long, device=device)
            self.positions = torch.zeros(batch, dtype=torch.long, device=device)
            fused = batch == 1 or self.fast.uses_small(batch)  # a chain of fused kernels, PDL among them
            self.attention = DecodeAttention(batch, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                             max_len, device, pdl=self.fast.pdl and fused)
            cache, attention = self._cache, self.attention
            if batch == 1:
                attend = lambda i, q, out: attention(q, cache.k[i], cache.v[i], self.positions, out)  # noqa: E731
                step = lambda: self.fast.decode_b1(self.tokens, self.positions, cache.k, cache.v, attend)  # noqa: E731
            elif fused:
                shape = (batch, c.num_attention_heads, c.head_dim)
                attend = lambda i, q, out: attention(q.view(shape), cache.k[i], cache.v[i], self.positions, out)  # noqa: E731
                step = lambda: self.fast.decode_small(self.tokens, self.positions, cache.k, cache.v, attend)  # noqa: E731
            else:
                step = lambda: self.fast.decode(self.tokens, self.positions, self._cache, self.attention)  # noqa: E731
            self._decode = _Graph(step, self.use_graphs)
            self.shape = (batch, max_len)
        return self._cache

    def prefill(self, tokens: Tensor) -> Tensor:
        """Next token of each of B fresh prompts of one length (tokens [B, T]), written into the cache."""
        B, T = tokens.shape
        if B * T > PREFILL_GRAPH_TOKENS:
            return self.fast.prefill(tokens, self._cache)
        if (B, T) not in self._prefills:
            static = tokens.clone()
            graph = _Graph(lambda: self.fast.prefill(static, self._cache), self.use_graphs)
            self._prefills[(B, T)] = graph
            graph.static = static
        graph = self._prefills[(B, T)]
        graph.static.copy_(tokens)
        return graph()

    def start(self, tokens: Tensor, positions: Tensor) -> None:
        """Decode from `tokens` [B] at `positions` [B] (each sequence's first decode step)."""
        self.tokens.copy_(tokens.view(-1))
        self.positions.copy_(positions.view(-1))

    def step(self) -> Tensor:
        """One decode pass: the next token of each sequence ([B], the decoder's own buffer, which
        the next step overwrites). Tokens and positions advance on the GPU, inside the graph."""
        return self._decode()
