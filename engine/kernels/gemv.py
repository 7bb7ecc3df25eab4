"""Batch-1 decode kernels: each reads its weight matrix once and does the small work around it.

At batch 1 a decode step is a chain of matrix-vector products, and on an H200 the small
operations between them (norms, rotary, residual adds, the attention merge) cost more in launches
than the weights cost to read. So each kernel here is a GEMV with that work folded in:

- `qkv_rope_cache`: RMSNorm(h) -> fused q|k|v projection + bias -> rotary on q and k -> k, v
  written into the cache at the token's position (dense) or slot (paged), q kept for attention.
- `gate_up_silu`: RMSNorm(h) -> gate|up projection -> silu(gate) * up.
- `gemv`: y = W @ x with an optional RMSNorm on x (the lm_head) or a residual add (o_proj and
  down_proj).

Each program owns R output rows and walks the input dimension in BK-wide tiles, accumulating in
fp32; every result is rounded to the model's dtype where the eager model rounds it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.elementwise import _rounded_product, _rounded_sum, _silu
from engine.kernels.pdl import pdl_launch, pdl_wait


@triton.jit
def _rstd(X, H: tl.constexpr, eps, BLOCK_H: tl.constexpr):
    cols = tl.arange(0, BLOCK_H)
    x = tl.load(X + cols, mask=cols < H, other=0.0).to(tl.float32)
    return 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)


@triton.jit
def _input(X, NW, cols, mask, rstd, NORM: tl.constexpr):
    """A tile of the input vector, RMS-normalised like the eager model when NORM."""
    x = tl.load(X + cols, mask=mask, other=0.0)
    if NORM:
        w = tl.load(NW + cols, mask=mask, other=0.0)
        x = _rounded_product(w, (x.to(tl.float32) * rstd).to(w.dtype))
    return x.to(tl.float32)


@triton.jit
def _gemv_kernel(W, X, NW, Res, Out, N, eps, K: tl.constexpr, BLOCK_K_ALL: tl.constexpr,
                 NORM: tl.constexpr, RESIDUAL: tl.constexpr, R: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    rows = tl.program_id(0) * R + tl.arange(0, R)
    row_ok = rows < N
    if NORM:
        rstd = _rstd(X, K, eps, BLOCK_K_ALL)
    else:
        rstd = 1.0
    acc = tl.zeros([R, BK], tl.float32)
    for k0 in range(0, K, BK):
        cols = k0 + tl.arange(0, BK)
        col_ok = cols < K
        x = _input(X, NW, cols, col_ok, rstd, NORM)
        w = tl.load(W + rows[:, None].to(tl.int64) * K + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1).to(Out.dtype.element_ty)
    if RESIDUAL:
        y = _rounded_sum(tl.load(Res + rows, mask=row_ok, other=0.0), y)
    tl.store(Out + rows, y, mask=row_ok)


def gemv(weight: torch.Tensor, x: torch.Tensor, out: torch.Tensor, *, norm_weight: torch.Tensor | None = None,
         eps: float = 1e-6, residual: torch.Tensor | None = None, rows: int = 16, block_k: int = 512,
         warps: int = 4, pdl: bool = False) -> torch.Tensor:
    """out = W @ RMSNorm(x) (with norm_weight) or residual + W @ x (with residual; out may be
    the residual itself). W [N, K], x [K]."""
    N, K = weight.shape
    _gemv_kernel[(triton.cdiv(N, rows),)](
        weight, x, norm_weight if norm_weight is not None else x, residual if residual is not None else out, out,
        N, eps, K=K, BLOCK_K_ALL=triton.next_power_of_2(K), NORM=norm_weight is not None,
        RESIDUAL=residual is not None, R=rows, BK=block_k, num_warps=warps, **pdl_launch(pdl))
    return out


@triton.jit
def _qkv_rope_cache_kernel(W, Bias, X, NW, Pos, Slot, Cos, Sin, Q, KC, VC, eps, kv_stride_h, kv_stride_s,
                           H: tl.constexpr, BLOCK_H: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
                           D: tl.constexpr, R: tl.constexpr, BK: tl.constexpr, PAGED: tl.constexpr,
                           PDL: tl.constexpr):
    pdl_wait(PDL)
    half: tl.constexpr = D // 2
    blocks: tl.constexpr = half // R
    pid = tl.program_id(0)
    head = pid // blocks                       # q heads, then k heads, then v heads
    j = (pid % blocks) * R + tl.arange(0, R)   # this program's rows in each half of the head
    rows1 = head * D + j
    rows2 = rows1 + half
    rstd = _rstd(X, H, eps, BLOCK_H)
    acc1 = tl.zeros([R, BK], tl.float32)
    acc2 = tl.zeros([R, BK], tl.float32)
    for k0 in range(0, H, BK):
        cols = k0 + tl.arange(0, BK)
        col_ok = (cols < H)[None, :]
        x = _input(X, NW, cols, cols < H, rstd, True)[None, :]
        acc1 += tl.load(W + rows1[:, None] * H + cols[None, :], mask=col_ok, other=0.0).to(tl.float32) * x
        acc2 += tl.load(W + rows2[:, None] * H + cols[None, :], mask=col_ok, other=0.0).to(tl.float32) * x
    dtype = Q.dtype.element_ty
    a1 = (tl.sum(acc1, axis=1) + tl.load(Bias + rows1).to(tl.float32)).to(dtype)
    a2 = (tl.sum(acc2, axis=1) + tl.load(Bias + rows2).to(tl.float32)).to(dtype)
    pos = tl.load(Pos).to(tl.int64)
    if head < HEADS + KV_HEADS:  # rotary, rounded as the eager model's fp16 products are
        cos = tl.load(Cos + pos * D + j)
        sin = tl.load(Sin + pos * D + j)
        r1 = _rounded_sum(_rounded_product(a1, cos), -_rounded_product(a2, sin))
        r2 = _rounded_sum(_rounded_product(a2, cos), _rounded_product(a1, sin))
        a1, a2 = r1, r2
    if PAGED:  # flat slot Slot[0] of [blocks * block_size, kv_heads, D]; -1: no cache write
        slot = tl.load(Slot).to(tl.int64)
        row = slot * kv_stride_s
        write = (slot + tl.zeros([R], tl.int64)) >= 0  # a mask of the stores' shape (see elementwise)
    else:  # position `pos` of [1, kv_heads, S, D]
        row = pos * D
        write = None
    if head < HEADS:
        tl.store(Q + head * D + j, a1)
        tl.store(Q + head * D + half + j, a2)
    elif head < HEADS + KV_HEADS:
        dst = KC + (head - HEADS) * kv_stride_h + row
        tl.store(dst + j, a1, mask=write)
        tl.store(dst + half + j, a2, mask=write)
    else:
        dst = VC + (head - HEADS - KV_HEADS) * kv_stride_h + row
        tl.store(dst + j, a1, mask=write)
        tl.store(dst + half + j, a2, mask=write)


def qkv_rope_cache(weight, bias, h, norm_weight, eps, position, cos, sin, q_out, k_cache, v_cache,
                   heads: int, kv_heads: int, rows: int = 16, block_k: int = 512, warps: int = 4,
                   pdl: bool = False, slot: torch.Tensor | None = None) -> None:
    """Batch 1: q_out [heads*D] and the caches [1, kv_heads, S, D] at `position` ([1] tensor) from
    h [H], through RMSNorm, the fused q|k|v projection with bias, and rotary.

    With `slot` ([1] int32 or int64 tensor), the caches are paged, [num_blocks, block_size,
    kv_heads, D], and k, v go to flat slot `slot[0]` (block * block_size + offset; -1 writes
    nothing); `position` still picks the rotary angle."""
    H = h.shape[-1]
    D = k_cache.shape[-1]
    if slot is None:
        paged, strides = False, (k_cache.stride(1), 0)
    else:  # flat slots need the blocks back to back: [num_blocks * block_size, kv_heads, D]
        assert k_cache.stride(0) == k_cache.shape[1] * k_cache.stride(1) and k_cache.stride() == v_cache.stride()
        paged, strides = True, (k_cache.stride(2), k_cache.stride(1))
    grid = ((heads + 2 * kv_heads) * (D // 2 // rows),)
    _qkv_rope_cache_kernel[grid](weight, bias, h, norm_weight, position, position if slot is None else slot, cos,
                                 sin, q_out, k_cache, v_cache, eps, *strides, H=H, BLOCK_H=triton.next_power_of_2(H),
                                 HEADS=heads, KV_HEADS=kv_heads, D=D, R=rows, BK=block_k, PAGED=paged,
                                 num_warps=warps, **pdl_launch(pdl))


@triton.jit
def _gate_up_silu_kernel(W, X, NW, Out, eps, I: tl.constexpr, H: tl.constexpr, BLOCK_H: tl.constexpr,
                         R: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    rows = tl.program_id(0) * R + tl.arange(0, R)
    row_ok = rows < I
    rstd = _rstd(X, H, eps, BLOCK_H)
    acc_g = tl.zeros([R, BK], tl.float32)
    acc_u = tl.zeros([R, BK], tl.float32)
    for k0 in range(0, H, BK):
        cols = k0 + tl.arange(0, BK)
        ok = row_ok[:, None] & (cols < H)[None, :]
        x = _input(X, NW, cols, cols < H, rstd, True)[None, :]
        acc_g += tl.load(W + rows[:, None].to(tl.int64) * H + cols[None, :], mask=ok, other=0.0).to(tl.float32) * x
        acc_u += tl.load(W + (rows[:, None] + I).to(tl.int64) * H + cols[None, :], mask=ok, other=0.0).to(tl.float32) * x
    dtype = Out.dtype.element_ty
    g = tl.sum(acc_g, axis=1).to(dtype).to(tl.float32)
    u = tl.sum(acc_u, axis=1).to(dtype)
    tl.store(Out + rows, _rounded_product(_silu(g).to(dtype), u), mask=row_ok)


def gate_up_silu(weight, h, norm_weight, eps, out, rows: int = 16, block_k: int = 512, warps: int = 4,
                 pdl: bool = False) -> None:
    """Batch 1: out [I] = silu(gate) * up of RMSNorm(h) through the fused gate|up weight [2I, H]."""
    I = out.shape[-1]
    H = h.shape[-1]
    _gate_up_silu_kernel[(triton.cdiv(I, rows),)](weight, h, norm_weight, out, eps, I=I, H=H,
                                                  BLOCK_H=triton.next_power_of_2(H), R=rows, BK=block_k,
                                                  num_warps=warps, **pdl_launch(pdl))
