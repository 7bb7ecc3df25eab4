"""Decode attention that reads only each sequence's live context (split-K, "flash decoding").

Grid (batch, kv_head, split): a program takes one KV head's GROUP query heads (grouped-query
attention: they share its keys and values) and one slice of the sequence's cached positions, and
writes an unnormalised partial output with its running max and sum. Slices past a sequence's
length exit at once, so a CUDA graph captured for the longest context still only reads what each
sequence holds. The last slice of a (sequence, KV head) to finish (a ticket taken with an atomic
add) merges all its slices and writes the output, so no second launch is needed. With enough
sequences to fill the GPU there is one slice per sequence and nothing to merge.

One kernel reads either cache layout (`PAGED`, a compile-time flag):
- dense (`DecodeAttention`): [B, kv_heads, S, D], sequence b's position n at [b, :, n];
- paged (`PagedDecodeAttention`): [num_blocks, block_size, kv_heads, D], sequence b's position n
  in block `block_tables[b, n // block_size]`, slot `n % block_size` (`_kv_rows` finds it). A
  sequence of length 0 is a padding row (a CUDA graph's batch rounded up): its first slice writes
  zeros and nothing is read.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from core.slicing import decode_slicing
from engine.kernels.one_variant import one_variant
from engine.kernels.pdl import pdl_launch, pdl_wait
from engine.kernels.tiles import DECODE_PROGRAMS, DECODE_SLICES, FILLS_GPU


# An attention object for up to this many (sequence, KV head) pairs reads each tile's block-table
# entries one tile ahead (a property of the object, not of each launch: a kernel launched outside a
# graph with a new batch size must not compile a second variant mid-run). On an H200 at 385 cached
# positions that took the paged kernel from 7.6 to 6.8 us a layer at batch 1 and from 8.9 to 7.9 at
# batch 8 (2 and 16 pairs), but from 15.2 to 18.3 at batch 64 and 36.5 to 43.4 at batch 256, where
# the programs fill the GPU and the held-over entries cost more than the wait.
AHEAD_PAIRS = 16


@triton.jit
def _kv_rows(b, n, live, kvh, BT, bt_stride, kv_stride_b, kv_stride_h, kv_stride_s,
             D: tl.constexpr, BLOCK_SIZE: tl.constexpr, PAGED: tl.constexpr):
    """Where the cached key/value rows of sequence b's positions n, KV head kvh, are: an offset for
    the head and one for each position (in elements; their sum addresses the row). Dense:
    [b, kvh, n] of [B, kv_heads, S, D]. Paged: slot n % BLOCK_SIZE of block BT[b, n // BLOCK_SIZE]
    of [num_blocks, BLOCK_SIZE, kv_heads, D]; positions not `live` do not read the block table (a
    row may hold only the blocks its sequence owns)."""
    if PAGED:
        block = tl.load(BT + b * bt_stride + n // BLOCK_SIZE, mask=live, other=0).to(tl.int64)
        base = kvh * kv_stride_h
        rows = block * kv_stride_b + (n % BLOCK_SIZE) * kv_stride_s
    else:
        base = b * kv_stride_b + kvh * kv_stride_h
        rows = n * D
    return base, rows


@triton.jit
def _softmax_step(s, v, m_i, l_i, acc, EXP2: tl.constexpr):
    """One block of keys into an online softmax: s [rows, keys] the scaled, masked scores (in
    natural units, or base-2 units when EXP2, the scale folded into one multiply), v [keys, D] the
    block's values; returns the running max, sum and unnormalised output (all fp32)."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    if EXP2:
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
    else:
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@one_variant(ints=("bt_stride", "SPLITS", "SLICE_MIN"), pointers=("Lens", "BT"))
def _decode_attention_kernel(Q, KC, VC, Lens, BT, Acc, M, L, Tickets, Out, scale, kv_stride_b, kv_stride_h,
                             kv_stride_s, bt_stride, SPLITS, SLICE_MIN,
                             SPLIT: tl.constexpr, GROUP: tl.constexpr,
                             GROUP_PAD: tl.constexpr, KV_HEADS: tl.constexpr, D: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr, PAGED: tl.constexpr,
                             DYNAMIC: tl.constexpr, PDL: tl.constexpr, AHEAD: tl.constexpr):
    # (SPLITS and SLICE_MIN are arguments, not compile-time constants: the slices follow the
    # launched batch, and a kernel launched outside a graph must not compile a variant a batch)
    pdl_wait(PDL)
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    if PAGED:  # Lens holds the lengths (0 for a padding row)
        length = tl.load(Lens + b).to(tl.int32)
    else:  # Lens holds the new token's positions: the positions up to and including it
        length = tl.load(Lens + b).to(tl.int32) + 1
    if DYNAMIC:  # up to SPLITS slices of this sequence's own length (whole blocks, at least SLICE_MIN)
        slice_len = tl.maximum(tl.cdiv(tl.cdiv(length, SPLITS), BLOCK_N) * BLOCK_N, SLICE_MIN)
    else:
        slice_len = SPLIT
    start = split * slice_len
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D)
    in_group = g < GROUP
    heads = b * KV_HEADS * GROUP + kvh * GROUP + g            # (sequence, query head) rows
    if start >= length:
        if length == 0 and split == 0:  # a padding row: zeros, so nothing downstream sees NaN
            tl.store(Out + heads[:, None] * D + d[None, :], tl.zeros([GROUP_PAD, D], Out.dtype.element_ty),
                     mask=in_group[:, None])
        return
    q = tl.load(Q + heads[:, None] * D + d[None, :], mask=in_group[:, None], other=0.0)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D], tl.float32)
    end = tl.minimum(start + slice_len, length)
    if AHEAD:  # each tile's rows looked up one tile ahead, as the tile before it loads (paged: a
        # block-table read, which the keys' and values' loads wait for)
        n = start + tl.arange(0, BLOCK_N)
        base, rows = _kv_rows(b, n, n < end, kvh, BT, bt_stride, kv_stride_b, kv_stride_h, kv_stride_s, D,
                              BLOCK_SIZE, PAGED)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        live = n < end
        if not AHEAD:
            base, rows = _kv_rows(b, n, live, kvh, BT, bt_stride, kv_stride_b, kv_stride_h, kv_stride_s, D,
                                  BLOCK_SIZE, PAGED)
        k = tl.load(KC + base + rows[:, None] + d[None, :], mask=live[:, None], other=0.0)
        v = tl.load(VC + base + rows[:, None] + d[None, :], mask=live[:, None], other=0.0)
        if AHEAD:
            after = n + BLOCK_N
            _, rows = _kv_rows(b, after, after < end, kvh, BT, bt_stride, kv_stride_b, kv_stride_h, kv_stride_s, D,
                               BLOCK_SIZE, PAGED)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(live[None, :], s, float("-inf"))
        m_i, l_i, acc = _softmax_step(s, v, m_i, l_i, acc, EXP2=False)
    if SPLITS == 1:  # the whole context in one slice: no partials, no merge
        o = acc / l_i[:, None]
        tl.store(Out + heads[:, None] * D + d[None, :], o.to(Out.dtype.element_ty), mask=in_group[:, None])
        return
    slot = heads * SPLITS + split
    tl.store(Acc + slot[:, None] * D + d[None, :], acc, mask=in_group[:, None])
    tl.store(M + slot, m_i, mask=in_group)
    tl.store(L + slot, l_i, mask=in_group)

    # The last live slice to get here merges them all (acq_rel: every slice's stores above are
    # visible to whoever draws the last ticket), then resets the ticket for the next call.
    live_splits = tl.cdiv(length, slice_len)
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


def _slice_length(batch: int, kv_heads: int, context: int, block_n: int) -> int:
    """Positions a slice: the whole context when there are enough (sequence, KV head) pairs to fill
    the GPU; otherwise about 16 slices, none shorter than two blocks nor longer than four."""
    whole = block_n * triton.cdiv(context, block_n)
    # (timed on an H200 at batch 1: 128 positions a slice best at 512 cached, 256 at 4352)
    return whole if batch * kv_heads >= 128 else \
        min(4 * block_n, max(2 * block_n, triton.next_power_of_2(triton.cdiv(context, 16))))


class _SplitK:
    """The launch both cache layouts share; a subclass owns the scratch (acc, m, l, tickets)."""

    def _launch(self, batch: int, split: int, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                lens: torch.Tensor, out: torch.Tensor, block_tables: torch.Tensor | None = None,
                splits: int | None = None, slice_min: int = 0) -> torch.Tensor:
        """`split` positions a slice over the longest context; or, with `splits`, up to that many
        slices of each sequence's own length, none shorter than `slice_min` positions."""
        dynamic = splits is not None
        if not dynamic:
            splits = triton.cdiv(self.context, split)
        if block_tables is None:  # dense [B, kv_heads, S, D]; lens holds positions
            paged, bt, strides = {"BLOCK_SIZE": 1, "PAGED": False}, lens, (k_cache.stride(0), k_cache.stride(1), 0, 0)
        else:  # paged [num_blocks, block_size, kv_heads, D]; lens holds lengths
            paged, bt = {"BLOCK_SIZE": k_cache.shape[1], "PAGED": True}, block_tables
            strides = (k_cache.stride(0), k_cache.stride(2), k_cache.stride(1), block_tables.stride(0))
        _decode_attention_kernel[(batch, self.kv_heads, splits)](
            q, k_cache, v_cache, lens, bt, self.acc, self.m, self.l, self.tickets, out, self.head_dim ** -0.5,
            *strides, splits, slice_min, SPLIT=0 if dynamic else split, GROUP=self.group,
            GROUP_PAD=max(16, triton.next_power_of_2(self.group)), KV_HEADS=self.kv_heads, D=self.head_dim,
            BLOCK_N=self.block_n if dynamic else min(self.block_n, split), DYNAMIC=dynamic, **paged,
            AHEAD=self.ahead, **pdl_launch(self.pdl))
        return out


class DecodeAttention(_SplitK):
    """Scratch buffers and launch parameters for one batch size and cache length, so a captured
    graph reuses the same memory at every replay."""

    def __init__(self, batch: int, heads: int, kv_heads: int, head_dim: int, cache_len: int,
                 device: torch.device | str, split: int | None = None, block_n: int = 64, pdl: bool = False):
        self.batch, self.heads, self.kv_heads, self.head_dim = batch, heads, kv_heads, head_dim
        self.group, self.pdl, self.context = heads // kv_heads, pdl, cache_len
        self.ahead = batch * kv_heads <= AHEAD_PAIRS
        self.split = split if split is not None else _slice_length(batch, kv_heads, cache_len, block_n)
        self.splits = triton.cdiv(cache_len, self.split)
        self.block_n = min(block_n, self.split)
        self.acc = torch.empty(batch * heads * self.splits * head_dim, dtype=torch.float32, device=device)
        self.m = torch.empty(batch * heads * self.splits, dtype=torch.float32, device=device)
        self.l = torch.empty_like(self.m)
        self.tickets = torch.zeros(batch * kv_heads, dtype=torch.int32, device=device)

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor,
                 out: torch.Tensor) -> torch.Tensor:
        """out [B, heads * D] = attention of q [B, heads, D] over caches [B, kv_heads, S, D], each
        sequence over positions 0..positions[b] (the token just written included)."""
        return self._launch(self.batch, self.split, q, k_cache, v_cache, positions, out)


class PagedDecodeAttention(_SplitK):
    """Decode attention over a paged cache, for any batch up to `max_batch` and contexts up to
    `max_len` positions. By default a launch cuts each sequence's own context into slices
    (whole blocks): while batch * kv_heads is too small to fill the GPU (under 256), up to 16 slices of at
    least 128 positions, fewer past 32 pairs so that a launch keeps to about 512 programs;
    beyond, up to 16 of at least 1,024, so that one long context in a big batch is not the whole
    pass's critical path (`core.slicing.decode_slicing`). A graph captured for the longest
    context launches slices that exit at once for short ones. `split` fixes the
    positions a slice instead (over `max_len`, as DecodeAttention). The scratch is sized in
    `__init__` for the most partials any batch up to `max_batch` needs, so one object serves
    graphs captured at several batch sizes."""

    SLICES = DECODE_SLICES  # engine.kernels.tiles: the rule, and why
    FILLS_GPU = FILLS_GPU
    PROGRAMS = DECODE_PROGRAMS  # None: every batch below FILLS_GPU pairs gets SLICES[False]

    def slicing(self) -> dict:
        """How contexts are sliced, for the cost model (`sim.calibrated`)."""
        return {"kv_heads": self.kv_heads, "fills_gpu": self.FILLS_GPU, "block_n": self.block_n,
                "small": list(self.SLICES[False]), "big": list(self.SLICES[True]), "programs": self.PROGRAMS}

    def _rule(self, batch: int) -> tuple[int, int]:
        return decode_slicing(batch * self.kv_heads, self.SLICES[False], self.SLICES[True], self.FILLS_GPU,
                              self.PROGRAMS)

    def __init__(self, max_batch: int, heads: int, kv_heads: int, head_dim: int, max_len: int, block_size: int,
                 device: torch.device | str, split: int | None = None, block_n: int = 64, pdl: bool = False):
        self.max_batch, self.heads, self.kv_heads, self.head_dim = max_batch, heads, kv_heads, head_dim
        self.group, self.pdl, self.context, self.block_size = heads // kv_heads, pdl, max_len, block_size
        self.fixed_split, self.block_n = split, block_n
        self.ahead = max_batch * kv_heads <= AHEAD_PAIRS
        # partials are kept only when a launch slices the context (more than one slice a sequence)
        pairs = max([b * s for b in range(1, max_batch + 1) if (s := self.slices_for(b)) > 1], default=1)
        self.acc = torch.empty(pairs * heads * head_dim, dtype=torch.float32, device=device)
        self.m = torch.empty(pairs * heads, dtype=torch.float32, device=device)
        self.l = torch.empty_like(self.m)
        self.tickets = torch.zeros(max_batch * kv_heads, dtype=torch.int32, device=device)

    def split_for(self, batch: int) -> int | None:
        """Positions a slice when `batch` sequences are launched (None: slices of each
        sequence's own length)."""
        return self.fixed_split

    def slices_for(self, batch: int) -> int:
        """The most slices a sequence's context is cut into when `batch` sequences are launched."""
        if self.fixed_split is not None:
            return triton.cdiv(self.context, self.fixed_split)
        slices, shortest = self._rule(batch)
        return max(1, min(slices, triton.cdiv(self.context, shortest)))

    def slice_min(self, batch: int) -> int:
        return self._rule(batch)[1]

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, out: torch.Tensor, batch: int | None = None) -> torch.Tensor:
        """out[b] ([B, heads * D]) = attention of q[b] ([B, heads, D]) over the first seq_lens[b]
        positions of sequence b (the new token's K/V already written), for b < batch (default
        max_batch; rows past it are left alone). Caches [num_blocks, block_size, kv_heads, D];
        block_tables int32 [>= batch, blocks a sequence]; seq_lens int32 [>= batch], each at most
        max_len. A row with seq_lens[b] == 0 is padding: it reads nothing, not even its block
        table, and gets zeros. Static for a CUDA graph: every tensor argument and `batch`."""
        assert k_cache.shape[1] == self.block_size and k_cache.stride(-1) == 1
        batch = self.max_batch if batch is None else batch
        assert batch <= self.max_batch
        if self.fixed_split is not None:
            return self._launch(batch, self.fixed_split, q, k_cache, v_cache, seq_lens, out, block_tables)
        return self._launch(batch, 0, q, k_cache, v_cache, seq_lens, out, block_tables, splits=self.slices_for(batch),
                            slice_min=self.slice_min(batch))
