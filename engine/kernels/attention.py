"""Decode attention that reads only each sequence's live context (split-K, "flash decoding").

Grid (batch, kv_head, split): a program takes one KV head's GROUP query heads (grouped-query
attention: they share its keys and values) and one slice of the sequence's cached positions,
and writes an unnormalised partial output with its running max and sum. Slices past a
sequence's length exit at once, so a CUDA graph captured for the longest context still only
reads what each sequence holds. `combine` (or the O-projection that follows, on the batch-1
path) merges the slices.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _decode_attention_kernel(Q, KC, VC, Lens, Acc, M, L, scale, kv_stride_b, kv_stride_h,
                             SPLIT: tl.constexpr, SPLITS: tl.constexpr, GROUP: tl.constexpr,
                             GROUP_PAD: tl.constexpr, KV_HEADS: tl.constexpr, D: tl.constexpr,
                             BLOCK_N: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(Lens + b).to(tl.int32)
    start = split * SPLIT
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D)
    heads = kvh * GROUP + g                                   # the query heads of this KV head
    out = ((b * KV_HEADS * GROUP + heads) * SPLITS + split)   # index of (b, head, split)
    if start >= length:
        tl.store(M + out, tl.full([GROUP_PAD], float("-inf"), tl.float32), mask=g < GROUP)
        tl.store(L + out, tl.zeros([GROUP_PAD], tl.float32), mask=g < GROUP)
        return
    q = tl.load(Q + (b * KV_HEADS * GROUP + heads)[:, None] * D + d[None, :], mask=(g < GROUP)[:, None], other=0.0)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D], tl.float32)
    end = tl.minimum(start + SPLIT, length)
    base = b * kv_stride_b + kvh * kv_stride_h
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        live = n < end
        k = tl.load(KC + base + n[:, None] * D + d[None, :], mask=live[:, None], other=0.0)
        v = tl.load(VC + base + n[:, None] * D + d[None, :], mask=live[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(live[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    tl.store(Acc + out[:, None] * D + d[None, :], acc, mask=(g < GROUP)[:, None])
    tl.store(M + out, m_i, mask=g < GROUP)
    tl.store(L + out, l_i, mask=g < GROUP)


@triton.jit
def _combine_kernel(Acc, M, L, Out, SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr, D: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)  # (batch, head)
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, D)
    m = tl.load(M + bh * SPLITS + s, mask=s < SPLITS, other=float("-inf"))
    l = tl.load(L + bh * SPLITS + s, mask=s < SPLITS, other=0.0)
    live = m > float("-inf")  # slices past the sequence's length wrote no partial output
    m_max = tl.max(m, axis=0)
    w = tl.where(live, tl.exp(m - m_max), 0.0)
    acc = tl.load(Acc + (bh * SPLITS + s)[:, None] * D + d[None, :], mask=live[:, None], other=0.0)
    o = tl.sum(acc * w[:, None], axis=0) / tl.sum(l * w, axis=0)
    tl.store(Out + bh * D + d, o.to(Out.dtype.element_ty))


class DecodeAttention:
    """Scratch buffers and launch parameters for one batch size and cache length, so a captured
    graph reuses the same memory at every replay."""

    def __init__(self, batch: int, heads: int, kv_heads: int, head_dim: int, cache_len: int,
                 device: torch.device | str, split: int | None = None, block_n: int = 64):
        self.batch, self.heads, self.kv_heads, self.head_dim = batch, heads, kv_heads, head_dim
        self.group = heads // kv_heads
        # Enough slices that even batch 1 spreads over the GPU, none shorter than one block.
        self.split = split or max(block_n, triton.next_power_of_2(triton.cdiv(cache_len, 16)))
        self.splits = triton.cdiv(cache_len, self.split)
        self.block_n = min(block_n, self.split)
        self.acc = torch.empty(batch * heads * self.splits * head_dim, dtype=torch.float32, device=device)
        self.m = torch.empty(batch * heads * self.splits, dtype=torch.float32, device=device)
        self.l = torch.empty_like(self.m)

    def partials(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lens: torch.Tensor) -> None:
        """q [B, heads, D]; caches [B, kv_heads, S, D]; lens [B] = positions each sequence holds
        (including the token just written)."""
        grid = (self.batch, self.kv_heads, self.splits)
        _decode_attention_kernel[grid](
            q, k_cache, v_cache, lens, self.acc, self.m, self.l, self.head_dim ** -0.5,
            k_cache.stride(0), k_cache.stride(1), SPLIT=self.split, SPLITS=self.splits, GROUP=self.group,
            GROUP_PAD=max(16, triton.next_power_of_2(self.group)), KV_HEADS=self.kv_heads, D=self.head_dim,
            BLOCK_N=self.block_n)

    def combine(self, out: torch.Tensor) -> torch.Tensor:
        """Merge the slices into out [B, heads * D] (its dtype)."""
        _combine_kernel[(self.batch * self.heads,)](self.acc, self.m, self.l, out, SPLITS=self.splits,
                                                     SPLITS_PAD=triton.next_power_of_2(self.splits),
                                                     D=self.head_dim)
        return out
