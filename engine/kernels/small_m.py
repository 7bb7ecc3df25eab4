"""Small-batch decode kernels: the batch-1 kernels (`engine.kernels.gemv`) for M rows at once.

At decode batches of a few sequences a step is still a chain of weight reads: cuBLAS plus a
separate kernel for each small operation reads each weight once but launches three times as
many kernels. Each kernel here reads a tile of its weight matrix once for all M rows (a
`tl.dot` of the rows' [BM, BK] activations with the [rows, BK] weight tile, fp32 accumulation;
M is padded to BM, a power of two of at least 16, so one compiled variant serves batches 2..16)
and does the batch-1 kernel's work around it, row by row:

- `qkv_rope_cache`: RMSNorm of each row -> q|k|v projection (+ bias when there is one) -> rotary
  at each row's position -> k, v written into the cache at the row's position (dense) or slot
  (paged; -1 writes nothing), q kept for attention.
- `gate_up_silu`: RMSNorm -> gate|up projection -> silu(gate) * up.
- `linear`: Y = X @ W^T with an optional RMSNorm of each row (the lm_head) or residual add (o_proj
  and down_proj).

Narrow matrices give few programs (o_proj and down_proj of a 1,536-wide model: 96 tiles of 16
rows), so each kernel can split its input dimension (`split`): every split stores its fp32
partial sums, the last to take the tile's ticket adds them in split order (the same sums whoever
finishes last) and does the epilogue, then resets the ticket. Every result is rounded to the
model's dtype where the eager model rounds it, as at batch 1.

Tiles are (rows per program, input tile width, warps, splits, pipeline stages).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.elementwise import _rounded_product, _rounded_sum, _silu
from engine.kernels.pdl import pdl_launch, pdl_wait


def block_m(batch: int) -> int:
    """The padded row count a batch runs at: a power of two, at least 16 (tl.dot's smallest)."""
    return max(16, triton.next_power_of_2(batch))


class Workspace:
    """The split kernels' fp32 partial sums and tickets (zero between launches: the last split
    of a tile resets its ticket). One per FastPath; kernels on one stream run one after another,
    so they share it. A buffer that must grow is replaced, the old one kept alive (a captured
    graph may still point at it)."""

    def __init__(self):
        self.partials: torch.Tensor | None = None
        self.tickets: torch.Tensor | None = None
        self._old: list[torch.Tensor] = []

    def get(self, partials: int, tickets: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        if self.partials is None or self.partials.numel() < partials or self.partials.device != torch.device(device):
            if self.partials is not None:
                self._old.append(self.partials)
            self.partials = torch.empty(max(partials, 1), dtype=torch.float32, device=device)
        if self.tickets is None or self.tickets.numel() < tickets or self.tickets.device != torch.device(device):
            if self.tickets is not None:
                self._old.append(self.tickets)
            self.tickets = torch.zeros(max(tickets, 1), dtype=torch.int32, device=device)
        return self.partials, self.tickets


@triton.jit
def _row_rstd(X, m, m_ok, K: tl.constexpr, eps, BM: tl.constexpr, BK: tl.constexpr):
    """1 / RMS of each of the rows m of X [M, K] (fp32 [BM])."""
    ss = tl.zeros([BM, BK], tl.float32)
    for k0 in range(0, K, BK):
        cols = k0 + tl.arange(0, BK)
        x = tl.load(X + m[:, None] * K + cols[None, :], mask=m_ok[:, None] & (cols < K)[None, :], other=0.0)
        x = x.to(tl.float32)
        ss += x * x
    return 1.0 / tl.sqrt(tl.sum(ss, axis=1) / K + eps)


@triton.jit
def _rows_tile(X, NW, m, m_ok, cols, col_ok, rstd, K: tl.constexpr, NORM: tl.constexpr):
    """A [BM, BK] tile of the input rows in the model's dtype, RMS-normalised like the eager model
    when NORM (the normalised row rounded, then the product with the norm weight rounded)."""
    x = tl.load(X + m[:, None] * K + cols[None, :], mask=m_ok[:, None] & col_ok[None, :], other=0.0)
    if NORM:
        w = tl.load(NW + cols, mask=col_ok, other=0.0)
        x = _rounded_product(w[None, :], (x.to(tl.float32) * rstd[:, None]).to(w.dtype))
    return x


@triton.jit
def _dot_rows(x, W, rows, row_ok, cols, col_ok, K: tl.constexpr, PRECISION: tl.constexpr):
    """x [BM, BK] times the weight rows `rows` of W [N, K] over `cols`: [BM, R] in fp32."""
    w = tl.load(W + rows[:, None].to(tl.int64) * K + cols[None, :], mask=row_ok[:, None] & col_ok[None, :],
                other=0.0)
    return tl.dot(x.to(w.dtype), tl.trans(w), input_precision=PRECISION)


@triton.jit
def _dot_two_row_sets(X, NW, W, m, m_ok, rstd, rows_a, rows_b, row_ok, k_lo, k_hi, K: tl.constexpr,
                      BM: tl.constexpr, R: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr):
    """The RMS-normalised rows of X times two sets of W's rows (q|k's two rotary halves, or gate and
    up) over this split's input range: two [BM, R] fp32 sums, each activation tile loaded once."""
    acc_a = tl.zeros([BM, R], tl.float32)
    acc_b = tl.zeros([BM, R], tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        cols = k0 + tl.arange(0, BK)
        col_ok = cols < k_hi
        x = _rows_tile(X, NW, m, m_ok, cols, col_ok, rstd, K, True)
        acc_a += _dot_rows(x, W, rows_a, row_ok, cols, col_ok, K, PRECISION)
        acc_b += _dot_rows(x, W, rows_b, row_ok, cols, col_ok, K, PRECISION)
    return acc_a, acc_b


@triton.jit
def _k_range(K: tl.constexpr, SPLIT: tl.constexpr, BK: tl.constexpr):
    """This program's slice of the input dimension: whole BK tiles, the last split taking the rest."""
    per: tl.constexpr = ((K + SPLIT - 1) // SPLIT + BK - 1) // BK * BK
    start = tl.program_id(1) * per
    return start, tl.minimum(start + per, K)


@triton.jit
def _stash(acc, Part, offs, slab, mask):
    """Store this split's partial sums (fp32) at offs of its slab."""
    tl.store(Part + tl.program_id(1) * slab + offs, acc, mask=mask)


@triton.jit
def _last(Tickets, ok):
    """ok where this program is the last split of its tile to finish (acq_rel: every split's
    stash is visible to it), else nothing; the last one resets the ticket for the next launch."""
    tile = tl.program_id(0)
    ticket = tl.atomic_add(Tickets + tile, 1)
    last = ticket == tl.num_programs(1) - 1
    tl.atomic_xchg(Tickets + tile, 0, mask=last)
    return ok & ((ticket + tl.zeros_like(ok).to(tl.int32)) == tl.num_programs(1) - 1)


@triton.jit
def _gathered(Part, offs, slab, mask, SPLIT: tl.constexpr):
    """The sum of all splits' partials at offs where mask (the last split's valid outputs), added
    in split order."""
    total = tl.load(Part + offs, mask=mask, other=0.0, cache_modifier=".cg")
    for s in tl.static_range(1, SPLIT):
        total += tl.load(Part + s * slab + offs, mask=mask, other=0.0, cache_modifier=".cg")
    return total


@triton.jit
def _linear_kernel(W, X, NW, Res, Out, Part, Tickets, M, N, eps, K: tl.constexpr, NORM: tl.constexpr,
                   RESIDUAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   SPLIT: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    m = tl.arange(0, BM)
    m_ok = m < M
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    n_ok = n < N
    if NORM:
        rstd = _row_rstd(X, m, m_ok, K, eps, BM, BK)
    else:
        rstd = tl.zeros([BM], tl.float32)
    k_lo, k_hi = _k_range(K, SPLIT, BK)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        cols = k0 + tl.arange(0, BK)
        col_ok = cols < k_hi
        x = _rows_tile(X, NW, m, m_ok, cols, col_ok, rstd, K, NORM)
        acc += _dot_rows(x, W, n, n_ok, cols, col_ok, K, PRECISION)
    offs = m[:, None] * N + n[None, :]
    ok = m_ok[:, None] & n_ok[None, :]
    if SPLIT > 1:
        slab = BM * N
        _stash(acc, Part, offs, slab, ok)
        ok = _last(Tickets, ok)
        acc = _gathered(Part, offs, slab, ok, SPLIT)
    y = acc.to(Out.dtype.element_ty)
    if RESIDUAL:
        y = _rounded_sum(tl.load(Res + offs, mask=ok, other=0.0), y)
    tl.store(Out + offs, y, mask=ok)


def _precision(dtype: torch.dtype) -> str:
    """fp32 models multiply in full fp32 (tf32 would round their inputs); fp16/bf16 are exact."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _splits(k: int, block_k: int, split: int) -> int:
    """No more splits than input tiles."""
    return max(1, min(split, triton.cdiv(k, block_k)))


def linear(weight: torch.Tensor, x: torch.Tensor, out: torch.Tensor, *, norm_weight: torch.Tensor | None = None,
           eps: float = 1e-6, residual: torch.Tensor | None = None, rows: int = 16, block_k: int = 128,
           warps: int = 4, split: int = 1, stages: int = 3, workspace: Workspace | None = None,
           pdl: bool = False) -> torch.Tensor:
    """out [M, N] = RMSNorm(x) @ W^T (with norm_weight) or residual + x @ W^T (with residual; out
    may be the residual itself). W [N, K], x [M, K], all contiguous."""
    N, K = weight.shape
    M = x.shape[0]
    BM = block_m(M)
    split = _splits(K, block_k, split)
    tiles = triton.cdiv(N, rows)
    part, tickets = (workspace or Workspace()).get(split * BM * N if split > 1 else 0, tiles, x.device)
    _linear_kernel[(tiles, split)](
        weight, x, norm_weight if norm_weight is not None else x, residual if residual is not None else out, out,
        part, tickets, M, N, eps, K=K, NORM=norm_weight is not None, RESIDUAL=residual is not None, BM=BM, BN=rows,
        BK=block_k, SPLIT=split, PRECISION=_precision(x.dtype), num_warps=warps, num_stages=stages,
        **pdl_launch(pdl))
    return out


@triton.jit
def _qkv_rope_cache_kernel(W, Bias, X, NW, Pos, Slots, Cos, Sin, Q, KC, VC, Part, Tickets, M, eps, kv_stride_b,
                           kv_stride_h, kv_stride_s, H: tl.constexpr, HEADS: tl.constexpr,
                           KV_HEADS: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, R: tl.constexpr,
                           BK: tl.constexpr, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, PAGED: tl.constexpr,
                           PRECISION: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    half: tl.constexpr = D // 2
    blocks: tl.constexpr = half // R
    N: tl.constexpr = (HEADS + 2 * KV_HEADS) * D
    pid = tl.program_id(0)
    head = pid // blocks                       # q heads, then k heads, then v heads
    j = (pid % blocks) * R + tl.arange(0, R)   # this program's rows in each half of the head
    rows1 = head * D + j
    rows2 = rows1 + half
    row_ok = j < half
    m = tl.arange(0, BM)
    m_ok = m < M
    rstd = _row_rstd(X, m, m_ok, H, eps, BM, BK)
    k_lo, k_hi = _k_range(H, SPLIT, BK)
    acc1, acc2 = _dot_two_row_sets(X, NW, W, m, m_ok, rstd, rows1, rows2, row_ok, k_lo, k_hi, H, BM, R, BK, PRECISION)
    ok = m_ok[:, None] & row_ok[None, :]
    if SPLIT > 1:
        slab = BM * N
        offs = m[:, None] * N + rows1[None, :]
        _stash(acc1, Part, offs, slab, ok)
        _stash(acc2, Part, offs + half, slab, ok)
        ok = _last(Tickets, ok)
        acc1 = _gathered(Part, offs, slab, ok, SPLIT)
        acc2 = _gathered(Part, offs + half, slab, ok, SPLIT)
    dtype = Q.dtype.element_ty
    if HAS_BIAS:
        acc1 += tl.load(Bias + rows1, mask=row_ok, other=0.0).to(tl.float32)[None, :]
        acc2 += tl.load(Bias + rows2, mask=row_ok, other=0.0).to(tl.float32)[None, :]
    a1 = acc1.to(dtype)
    a2 = acc2.to(dtype)
    pos = tl.load(Pos + m, mask=m_ok, other=0).to(tl.int64)
    if head < HEADS + KV_HEADS:  # rotary, rounded as the eager model's fp16 products are
        cos = tl.load(Cos + pos[:, None] * D + j[None, :], mask=ok, other=0.0)
        sin = tl.load(Sin + pos[:, None] * D + j[None, :], mask=ok, other=0.0)
        r1 = _rounded_sum(_rounded_product(a1, cos), -_rounded_product(a2, sin))
        r2 = _rounded_sum(_rounded_product(a2, cos), _rounded_product(a1, sin))
        a1, a2 = r1, r2
    if PAGED:  # flat slot Slots[m] of [blocks * block_size, kv_heads, D]; -1: no cache write
        slot = tl.load(Slots + m, mask=m_ok, other=-1).to(tl.int64)
        row = slot * kv_stride_s
        write = ok & (slot >= 0)[:, None]
    else:  # [m, :, pos] of [B, kv_heads, S, D]
        row = m.to(tl.int64) * kv_stride_b + pos * D
        write = ok
    if head < HEADS:
        dst = Q + m[:, None] * (HEADS * D) + head * D + j[None, :]
        tl.store(dst, a1, mask=ok)
        tl.store(dst + half, a2, mask=ok)
    elif head < HEADS + KV_HEADS:
        dst = KC + (head - HEADS) * kv_stride_h + row[:, None] + j[None, :]
        tl.store(dst, a1, mask=write)
        tl.store(dst + half, a2, mask=write)
    else:
        dst = VC + (head - HEADS - KV_HEADS) * kv_stride_h + row[:, None] + j[None, :]
        tl.store(dst, a1, mask=write)
        tl.store(dst + half, a2, mask=write)


def qkv_rope_cache(weight, bias, h, norm_weight, eps, positions, cos, sin, q_out, k_cache, v_cache,
                   heads: int, kv_heads: int, rows: int = 16, block_k: int = 128, warps: int = 4, split: int = 1,
                   stages: int = 3, slots: torch.Tensor | None = None, workspace: Workspace | None = None,
                   pdl: bool = False) -> None:
    """M rows h [M, H] (contiguous): q_out [M, heads * D] and k, v of row m into the caches at
    positions[m] ([M] tensor), through RMSNorm, the fused q|k|v projection (+ bias, when not
    None) and rotary. Dense caches: [B >= M, kv_heads, S, D], row m in sequence m. With `slots`
    ([M], int32 or int64) the caches are paged, [num_blocks, block_size, kv_heads, D], and row m
    goes to flat slot slots[m] (-1 writes nothing); positions still pick the rotary angles.
    `rows` is per half of a head (at most D / 2)."""
    M, H = h.shape
    D = k_cache.shape[-1]
    rows = min(rows, D // 2)
    assert (D // 2) % rows == 0, f"rows per program ({rows}) must divide half a head ({D // 2})"
    if slots is None:
        paged, strides = False, (k_cache.stride(0), k_cache.stride(1), 0)
    else:  # flat slots need the blocks back to back: [num_blocks * block_size, kv_heads, D]
        assert k_cache.stride(0) == k_cache.shape[1] * k_cache.stride(1) and k_cache.stride() == v_cache.stride()
        paged, strides = True, (0, k_cache.stride(2), k_cache.stride(1))
    BM = block_m(M)
    split = _splits(H, block_k, split)
    tiles = (heads + 2 * kv_heads) * (D // 2 // rows)
    part, tickets = (workspace or Workspace()).get(split * BM * (heads + 2 * kv_heads) * D if split > 1 else 0,
                                                   tiles, h.device)
    _qkv_rope_cache_kernel[(tiles, split)](
        weight, bias if bias is not None else weight, h, norm_weight, positions,
        positions if slots is None else slots, cos, sin, q_out, k_cache, v_cache, part, tickets, M, eps, *strides,
        H=H, HEADS=heads, KV_HEADS=kv_heads, D=D, BM=BM, R=rows, BK=block_k, SPLIT=split,
        HAS_BIAS=bias is not None, PAGED=paged, PRECISION=_precision(h.dtype), num_warps=warps, num_stages=stages,
        **pdl_launch(pdl))


@triton.jit
def _gate_up_silu_kernel(W, X, NW, Out, Part, Tickets, M, eps, I: tl.constexpr, H: tl.constexpr, BM: tl.constexpr,
                         R: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr, PRECISION: tl.constexpr,
                         PDL: tl.constexpr):
    pdl_wait(PDL)
    rows = tl.program_id(0) * R + tl.arange(0, R)
    row_ok = rows < I
    m = tl.arange(0, BM)
    m_ok = m < M
    rstd = _row_rstd(X, m, m_ok, H, eps, BM, BK)
    k_lo, k_hi = _k_range(H, SPLIT, BK)
    acc_g, acc_u = _dot_two_row_sets(X, NW, W, m, m_ok, rstd, rows, rows + I, row_ok, k_lo, k_hi, H, BM, R, BK,
                                     PRECISION)
    offs = m[:, None] * I + rows[None, :]
    ok = m_ok[:, None] & row_ok[None, :]
    if SPLIT > 1:
        slab = 2 * BM * I
        _stash(acc_g, Part, offs, slab, ok)
        _stash(acc_u, Part, offs + BM * I, slab, ok)
        ok = _last(Tickets, ok)
        acc_g = _gathered(Part, offs, slab, ok, SPLIT)
        acc_u = _gathered(Part, offs + BM * I, slab, ok, SPLIT)
    dtype = Out.dtype.element_ty
    g = acc_g.to(dtype).to(tl.float32)
    u = acc_u.to(dtype)
    tl.store(Out + offs, _rounded_product(_silu(g).to(dtype), u), mask=ok)


def gate_up_silu(weight, h, norm_weight, eps, out, rows: int = 16, block_k: int = 128, warps: int = 4,
                 split: int = 1, stages: int = 3, workspace: Workspace | None = None, pdl: bool = False) -> None:
    """out [M, I] = silu(gate) * up of RMSNorm(h [M, H]) through the fused gate|up weight [2I, H]."""
    M, H = h.shape
    I = out.shape[-1]
    BM = block_m(M)
    split = _splits(H, block_k, split)
    tiles = triton.cdiv(I, rows)
    part, tickets = (workspace or Workspace()).get(split * 2 * BM * I if split > 1 else 0, tiles, h.device)
    _gate_up_silu_kernel[(tiles, split)](weight, h, norm_weight, out, part, tickets, M, eps, I=I, H=H, BM=BM, R=rows,
                                         BK=block_k, SPLIT=split, PRECISION=_precision(h.dtype), num_warps=warps,
                                         num_stages=stages, **pdl_launch(pdl))
