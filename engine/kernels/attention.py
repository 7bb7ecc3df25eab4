"""Decode attention that reads only each sequence's live context (split-K, "flash decoding").

Grid (batch, kv_head, split): a program takes one KV head's GROUP query heads (grouped-query
attention: they share its keys and values) and one slice of the sequence's cached positions, and
writes an unnormalised partial output with its running max and sum. Slices past a sequence's
length exit at once, so a CUDA graph captured for the longest context still only reads what each
sequence holds. The last slice of a (sequence, KV head) to finish (a ticket taken with an atomic
add) merges all its slices and writes the output, so no second launch is needed.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _decode_attention_kernel(Q, KC, VC, Lens, Acc, M, L, Tickets, Out, scale, kv_stride_b, kv_stride_h,
                             SPLIT: tl.constexpr, SPLITS: tl.constexpr, GROUP: tl.constexpr,
                             GROUP_PAD: tl.constexpr, KV_HEADS: tl.constexpr, D: tl.constexpr,
                             BLOCK_N: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(Lens + b).to(tl.int32)
    start = split * SPLIT
    if start >= length:
        return
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D)
    in_group = g < GROUP
    heads = b * KV_HEADS * GROUP + kvh * GROUP + g            # (sequence, query head) rows
    q = tl.load(Q + heads[:, None] * D + d[None, :], mask=in_group[:, None], other=0.0)
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
    slot = heads * SPLITS + split
    tl.store(Acc + slot[:, None] * D + d[None, :], acc, mask=in_group[:, None])
    tl.store(M + slot, m_i, mask=in_group)
    tl.store(L + slot, l_i, mask=in_group)

    # The last live slice to get here merges them all (acq_rel: every slice's stores above are
    # visible to whoever draws the last ticket), then resets the ticket for the next call.
    live_splits = tl.cdiv(length, SPLIT)
    counter = Tickets + b * KV_HEADS + kvh
    if tl.atomic_add(counter, 1) == live_splits - 1:
        m_all = tl.full([GROUP_PAD], -1e30, tl.float32)  # finite, so padded rows give 0, not NaN
        l_all = tl.zeros([GROUP_PAD], tl.float32)
        o = tl.zeros([GROUP_PAD, D], tl.float32)
        for s_idx in range(0, live_splits):
            at = heads * SPLITS + s_idx
            m_s = tl.load(M + at, mask=in_group, other=float("-inf"), cache_modifier=".cg")
            l_s = tl.load(L + at, mask=in_group, other=0.0, cache_modifier=".cg")
            a_s = tl.load(Acc + at[:, None] * D + d[None, :], mask=in_group[:, None], other=0.0, cache_modifier=".cg")
            m_new = tl.maximum(m_all, m_s)
            old, new = tl.exp(m_all - m_new), tl.exp(m_s - m_new)
            o = o * old[:, None] + a_s * new[:, None]
            l_all = l_all * old + l_s * new
            m_all = m_new
        o = o / l_all[:, None]
        tl.store(Out + heads[:, None] * D + d[None, :], o.to(Out.dtype.element_ty), mask=in_group[:, None])
        tl.atomic_xchg(counter, 0)


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
        self.tickets = torch.zeros(batch * kv_heads, dtype=torch.int32, device=device)

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lens: torch.Tensor,
                 out: torch.Tensor) -> torch.Tensor:
        """out [B, heads * D] = attention of q [B, heads, D] over caches [B, kv_heads, S, D], each
        sequence over its first lens[b] positions (including the token just written)."""
        grid = (self.batch, self.kv_heads, self.splits)
        _decode_attention_kernel[grid](
            q, k_cache, v_cache, lens, self.acc, self.m, self.l, self.tickets, out, self.head_dim ** -0.5,
            k_cache.stride(0), k_cache.stride(1), SPLIT=self.split, SPLITS=self.splits, GROUP=self.group,
            GROUP_PAD=max(16, triton.next_power_of_2(self.group)), KV_HEADS=self.kv_heads, D=self.head_dim,
            BLOCK_N=self.block_n)
        return out
