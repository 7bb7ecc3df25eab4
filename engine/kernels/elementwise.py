"""Triton kernels for the small operations between matmuls, each one launch instead of several.

Every kernel rounds to the model's dtype where the eager PyTorch model does (after the norm, after
each product and sum of the rotary, after silu, after each residual add), so the fast path computes
the eager path's function; only the order of the long sums (norms, matmuls) differs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.one_variant import one_variant


@triton.jit
def _rounded_product(a, b):
    """a * b rounded to a's dtype, as a separate eager multiply is (in fp32, then rounded, so the
    compiler cannot fuse it with a neighbouring add into an FMA)."""
    return (a.to(tl.float32) * b.to(tl.float32)).to(a.dtype)


@triton.jit
def _rounded_sum(a, b):
    """a + b rounded to a's dtype, computed in fp32 as PyTorch's eager fp16 add is."""
    return (a.to(tl.float32) + b.to(tl.float32)).to(a.dtype)


@triton.jit
def _silu(x):
    """silu in fp32 the way PyTorch writes it, x / (1 + exp(-x))."""
    return x / (1.0 + tl.exp(-x))


@triton.jit
def _add_rmsnorm_kernel(X, Delta, W, Y, H: tl.constexpr, eps, BLOCK: tl.constexpr, ADD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(X + row * H + cols, mask=mask, other=0.0)
    if ADD:  # the residual add the eager model does in fp16, then written back
        x = _rounded_sum(x, tl.load(Delta + row * H + cols, mask=mask, other=0.0))
        tl.store(X + row * H + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / H + eps)
    w = tl.load(W + cols, mask=mask, other=0.0)
    tl.store(Y + row * H + cols, _rounded_product(w, (xf * rstd).to(w.dtype)), mask=mask)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor,
            delta: torch.Tensor | None = None) -> torch.Tensor:
    """out = RMSNorm(x [+ delta]) over the last dim; with `delta`, x += delta in place first."""
    H = x.shape[-1]
    rows = x.numel() // H
    _add_rmsnorm_kernel[(rows,)](x, delta if delta is not None else x, weight, out, H, eps,
                                 BLOCK=triton.next_power_of_2(H), ADD=delta is not None)
    return out


@one_variant(pointers=("Pos", "Slots"))
def _rope_cache_kernel(QKV, Pos, Slots, Cos, Sin, Q, KC, VC, T, kv_stride_b, kv_stride_h, kv_stride_s,
                       HEADS: tl.constexpr, KV_HEADS: tl.constexpr, D: tl.constexpr, ALL: tl.constexpr,
                       PAGED: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(Pos + tok).to(tl.int64)
    half: tl.constexpr = D // 2
    h = tl.arange(0, ALL)                     # q heads, then k heads, then v heads (padded to ALL)
    j = tl.arange(0, half)
    valid = (h < HEADS + 2 * KV_HEADS)[:, None]
    base = QKV + tok * (HEADS + 2 * KV_HEADS) * D + h[:, None] * D + j[None, :]
    x1 = tl.load(base, mask=valid, other=0.0)
    x2 = tl.load(base + half, mask=valid, other=0.0)
    cos = tl.load(Cos + pos * D + j)[None, :]
    sin = tl.load(Sin + pos * D + j)[None, :]
    rotate = (h < HEADS + KV_HEADS)[:, None]
    # x * cos + rotate_half(x) * sin, rounded after each product as the eager model's fp16 ops are
    # (products taken in fp32 and rounded explicitly, so the compiler cannot fuse them into an FMA)
    r1 = tl.where(rotate, _rounded_sum(_rounded_product(x1, cos), -_rounded_product(x2, sin)), x1)
    r2 = tl.where(rotate, _rounded_sum(_rounded_product(x2, cos), _rounded_product(x1, sin)), x2)
    is_q = (h < HEADS)[:, None]
    q_off = Q + tok * HEADS * D + h[:, None] * D + j[None, :]
    tl.store(q_off, r1, mask=is_q)
    tl.store(q_off + half, r2, mask=is_q)
    is_k = ((h >= HEADS) & (h < HEADS + KV_HEADS))[:, None]
    is_v = ((h >= HEADS + KV_HEADS) & (h < HEADS + 2 * KV_HEADS))[:, None]
    if PAGED:  # the token's row: flat slot Slots[tok] of [blocks * block_size, kv_heads, D]; -1: none
        slot = tl.load(Slots + tok).to(tl.int64)
        row = slot * kv_stride_s
        write = (slot + tl.zeros([ALL, 1], tl.int64)) >= 0  # a tensor of the masks' shape: Triton 3.9's
        is_k = is_k & write                                 # interpreter takes a scalar `&` as integers
        is_v = is_v & write
    else:  # [b, :, pos] of [B, kv_heads, S, D], token tok belonging to sequence tok // T
        row = (tok // T) * kv_stride_b + pos * D
    kvh = tl.where(h < HEADS + KV_HEADS, h - HEADS, h - HEADS - KV_HEADS)
    c_off = row + kvh[:, None] * kv_stride_h + j[None, :]
    tl.store(KC + c_off, r1, mask=is_k)
    tl.store(KC + c_off + half, r2, mask=is_k)
    tl.store(VC + c_off, r1, mask=is_v)
    tl.store(VC + c_off + half, r2, mask=is_v)


def rope_and_cache(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   q_out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, heads: int,
                   kv_heads: int, tokens_per_seq: int) -> None:
    """Rotate q and k of every token (qkv [N, (heads + 2 kv_heads) * D], token i belonging to
    sequence i // tokens_per_seq at positions[i]); write q to q_out [N, heads, D] and k, v into
    the caches [B, kv_heads, S, D] at their positions."""
    D = k_cache.shape[-1]
    n = qkv.numel() // qkv.shape[-1]
    _rope_cache_kernel[(n,)](qkv, positions, positions, cos, sin, q_out, k_cache, v_cache, tokens_per_seq,
                             k_cache.stride(0), k_cache.stride(1), 0, HEADS=heads, KV_HEADS=kv_heads, D=D,
                             ALL=triton.next_power_of_2(heads + 2 * kv_heads), PAGED=False)


def rope_and_paged_cache(qkv: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor, q_out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         heads: int, kv_heads: int) -> None:
    """Rotate q and k of every token i (qkv [N, (heads + 2 kv_heads) * D]) by positions[i]; write q
    to q_out [N, heads, D] and k, v into the paged caches [num_blocks, block_size, kv_heads, D] at
    flat slot slots[i] (block * block_size + offset; int32 or int64). A slot of -1 marks a padding
    token: its q is written, the caches are not (its position must still index the cos/sin
    tables, e.g. 0)."""
    D = k_cache.shape[-1]
    n = qkv.numel() // qkv.shape[-1]
    # flat slots need the blocks back to back: [num_blocks * block_size, kv_heads, D]
    assert k_cache.stride(0) == k_cache.shape[1] * k_cache.stride(1) and k_cache.stride() == v_cache.stride()
    _rope_cache_kernel[(n,)](qkv, positions, slots, cos, sin, q_out, k_cache, v_cache, 1, 0, k_cache.stride(2),
                             k_cache.stride(1), HEADS=heads, KV_HEADS=kv_heads, D=D,
                             ALL=triton.next_power_of_2(heads + 2 * kv_heads), PAGED=True)


@triton.jit
def _silu_mul_kernel(GU, Out, I: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    g = tl.load(GU + row * 2 * I + cols, mask=mask, other=0.0)
    u = tl.load(GU + row * 2 * I + I + cols, mask=mask, other=0.0)
    tl.store(Out + row * I + cols, _rounded_product(_silu(g.to(tl.float32)).to(g.dtype), u), mask=mask)


def silu_mul(gate_up: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = silu(gate) * up, where gate_up = [gate | up] along the last dim."""
    inter = out.shape[-1]
    rows = out.numel() // inter
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(inter, block))](gate_up, out, inter, BLOCK=block)
    return out
