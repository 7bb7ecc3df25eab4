"""Causal attention of a batch of prompt chunks over a paged KV cache (flash attention).

The continuous engine's mixed passes put many sequences' new tokens in one flat batch: a fresh
prompt, a chunk of a long prompt on top of the part already cached, single decode tokens. Each
sequence's new keys and values are already in the cache (`rope_and_paged_cache`), so every query
reads all it attends to, its context and the chunk itself, from the cache through the sequence's
block table.

Grid (query tile, kv_head). A program takes one KV head and BLOCK_M rows of (token, query head)
pairs: TOK = BLOCK_M // GROUP consecutive tokens of one sequence, each with the GROUP query heads
that share that KV head (grouped-query attention: 21 tokens x 6 heads = 126 of 128 rows for
Qwen2.5-1.5B). So each key/value block read from the cache serves the whole group at once, a
decode token fills GROUP rows of a tile rather than one, and the tile is still one tensor-core
matrix for `tl.dot`. The program walks the keys in BLOCK_N blocks with an online softmax in fp32:
first the blocks every row of the tile sees in full (no mask), then the few across the causal
diagonal, masked. Nothing past the tile's last query position is read.

Tiles are mapped to sequences on the device, with no host work and no extra launch: sequence s's
tiles are numbered from `query_start[s] // TOK + s`, an increasing series that leaves room for
`cdiv(len_s, TOK)` tiles each, so N // TOK + S programs cover any split of N tokens among S
sequences and each finds its sequence by a binary search over `query_start` (log2 S loads, all
hitting the cache); the few surplus programs exit at once. Within a sequence the tiles run last
first: the later a tile, the more keys it reads, so the longest start earliest.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.attention import _kv_rows, _softmax_step
from engine.kernels.one_variant import one_variant
from engine.kernels.tiles import chunk_tile


@one_variant(ints=("S", "bt_stride"), pointers=("BT", "QStart", "CtxLens"))
def _chunk_attention_kernel(Q, KC, VC, BT, QStart, CtxLens, Out, qk_scale, S, kv_stride_b, kv_stride_h,
                            kv_stride_s, bt_stride, HEADS: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                            SEARCH: tl.constexpr):
    TOK: tl.constexpr = BLOCK_M // GROUP  # query tokens a tile
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    # The sequence: the last s whose first tile, QStart[s] // TOK + s, is at or before this one.
    lo = 0
    hi = S
    for _ in range(SEARCH):
        mid = (lo + hi) // 2
        at_or_before = tl.load(QStart + mid) // TOK + mid <= tile
        lo = tl.where(at_or_before, mid, lo)
        hi = tl.where(at_or_before, hi, mid)
    seq = lo
    q_start = tl.load(QStart + seq)
    q_len = tl.load(QStart + seq + 1) - q_start
    tiles = tl.cdiv(q_len, TOK)
    local = tile - (q_start // TOK + seq)
    if (local < 0) | (local >= tiles):  # a surplus program, or tokens before QStart[0]
        return
    j0 = (tiles - 1 - local) * TOK        # the tile's first token in the chunk (last tiles first)
    ctx = tl.load(CtxLens + seq)
    r = tl.arange(0, BLOCK_M)
    tok = j0 + r // GROUP
    row_ok = (r < TOK * GROUP) & (tok < q_len)
    rows = (q_start + tok).to(tl.int64) * HEADS + kvh * GROUP + r % GROUP  # (token, query head) rows
    d = tl.arange(0, D)
    q = tl.load(Q + rows[:, None] * D + d[None, :], mask=row_ok[:, None], other=0.0)
    pos = ctx + tok                       # each row's position: it sees keys 0..pos
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    end = ctx + tl.minimum(j0 + TOK, q_len)       # one past the last key any row sees
    unmasked = (ctx + j0 + 1) // BLOCK_N * BLOCK_N  # whole blocks every row sees
    for n0 in range(0, unmasked, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        base, kv = _kv_rows(seq, n, n < end, kvh, BT, bt_stride, kv_stride_b, kv_stride_h, kv_stride_s, D,
                            BLOCK_SIZE, True)
        k = tl.load(KC + base + kv[:, None] + d[None, :])
        v = tl.load(VC + base + kv[:, None] + d[None, :])
        m_i, l_i, acc = _softmax_step(tl.dot(q, tl.trans(k)) * qk_scale, v, m_i, l_i, acc, EXP2=True)
    for n0 in range(unmasked, end, BLOCK_N):  # across the diagonal: each row up to its own position
        n = n0 + tl.arange(0, BLOCK_N)
        live = n < end
        base, kv = _kv_rows(seq, n, live, kvh, BT, bt_stride, kv_stride_b, kv_stride_h, kv_stride_s, D, BLOCK_SIZE,
                            True)
        k = tl.load(KC + base + kv[:, None] + d[None, :], mask=live[:, None], other=0.0)
        v = tl.load(VC + base + kv[:, None] + d[None, :], mask=live[:, None], other=0.0)
        s = tl.where(live[None, :] & (n[None, :] <= pos[:, None]), tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m_i, l_i, acc = _softmax_step(s, v, m_i, l_i, acc, EXP2=True)
    # every row saw key 0 in its first block, so l_i > 0
    tl.store(Out + rows[:, None] * D + d[None, :], (acc / l_i[:, None]).to(Out.dtype.element_ty),
             mask=row_ok[:, None])


def chunk_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    query_start: torch.Tensor, context_lens: torch.Tensor, out: torch.Tensor,
                    max_query_len: int | None = None, *, block_m: int = 128, block_n: int = 64,
                    num_warps: int | None = None, num_stages: int = 3) -> torch.Tensor:
    """Causal attention of a flat batch of new tokens over a paged cache.

    q [N, heads, D]; caches [num_blocks, block_size, kv_heads, D]; block_tables int32
    [S, blocks a sequence]; query_start int32 [S + 1], cumulative (sequence s owns rows
    query_start[s] .. query_start[s + 1] - 1, and may own none); context_lens int32 [S], the
    positions cached before this chunk. Row query_start[s] + j sits at position
    context_lens[s] + j and attends to positions 0 .. context_lens[s] + j of sequence s, whose
    keys and values, this chunk's included, are already in the cache. Writes out [N, heads * D]
    for every owned row; rows owned by no sequence (padding) are left alone.

    `max_query_len` (a Python int, the most tokens any sequence brings) only picks the tile: a
    smaller one for batches of short rows; any value gives the same result. Grid:
    (N // TOK + S, kv_heads), fixed by the shapes alone, so a CUDA graph can capture the call with
    static tensors and a static `max_query_len`; the host never reads the index tensors.
    Tiles (from compiling for sm_90, not yet timed): 128 rows x 64 keys, 8 warps, 3 stages,
    pipelined, on wgmma, no spills."""
    N, heads, D = q.shape
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    S = query_start.numel() - 1
    assert k_cache.stride(-1) == 1 and q.is_contiguous() and out.is_contiguous()
    rows = chunk_tile(group, max_query_len, block_m)
    grid = (N // (rows // group) + S, kv_heads)
    _chunk_attention_kernel[grid](
        q, k_cache, v_cache, block_tables, query_start, context_lens, out, D ** -0.5 * 1.4426950408889634, S,
        k_cache.stride(0), k_cache.stride(2), k_cache.stride(1), block_tables.stride(0), HEADS=heads, GROUP=group,
        D=D, BLOCK_M=rows, BLOCK_N=block_n, BLOCK_SIZE=k_cache.shape[1], SEARCH=max(11, S.bit_length()),
        num_warps=num_warps or (8 if rows >= 128 else 4), num_stages=num_stages)
    return out
