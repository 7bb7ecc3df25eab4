"""Compile the engine's GPU kernels for a Hopper GPU (sm_90, the H200's) on any machine and print
their PTX as JSON, by case name: Triton's own compiler and `ptxas`, no GPU needed. Run in a process
of its own (`tests/test_hopper_ptx.py` does), without TRITON_INTERPRET: under the interpreter
`triton.jit` gives functions the compiler cannot take."""
from __future__ import annotations

import json
import os
import sys

assert not os.environ.get("TRITON_INTERPRET"), "compile without TRITON_INTERPRET"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from engine.kernels import gemv as G  # noqa: E402
from engine.kernels import small_m as S  # noqa: E402
from engine.kernels.attention import _decode_attention_kernel  # noqa: E402


def hopper_ptx(kernel, num_warps: int = 4, **args) -> str:
    """PTX of `kernel` for sm_90: a runtime argument given as its type ("*fp16", "i32", "fp32"),
    a constexpr as its value. Compiled to a cubin too, so `ptxas` has accepted it."""
    signature, constants = {}, {}
    for p in kernel.params:
        if p.is_constexpr:
            signature[p.name], constants[p.name] = "constexpr", args[p.name]
        else:
            signature[p.name] = args[p.name]
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constants),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    assert compiled.asm["cubin"]
    return compiled.asm["ptx"]


def gemv(pdl: bool) -> str:
    return hopper_ptx(G._gemv_kernel, W="*fp16", X="*fp16", NW="*fp16", Res="*fp16", Out="*fp16", N="i32",
                      eps="fp32", K=1536, BLOCK_K_ALL=2048, NORM=False, RESIDUAL=True, R=8, BK=512, PDL=pdl)


SMALL = dict(Part="*fp32", Tickets="*i32", M="i32", eps="fp32", BM=16, PRECISION="tf32", PDL=True)


def attention(paged: bool) -> str:
    return hopper_ptx(_decode_attention_kernel, Q="*fp16", KC="*fp16", VC="*fp16", Lens="*i32", BT="*i32",
                      Acc="*fp32", M="*fp32", L="*fp32", Tickets="*i32", Out="*fp16", scale="fp32",
                      kv_stride_b="i32", kv_stride_h="i32", kv_stride_s="i32", bt_stride="i32", SPLITS="i32",
                      SLICE_MIN="i32", SPLIT=0, GROUP=6, GROUP_PAD=16, KV_HEADS=2, D=128, BLOCK_N=64,
                      BLOCK_SIZE=16 if paged else 1, PAGED=paged, DYNAMIC=True, PDL=True, AHEAD=paged)


CASES = {
    "gemv pdl": lambda: gemv(True),
    "gemv": lambda: gemv(False),
    "b1 qkv pdl": lambda: hopper_ptx(
        G._qkv_rope_cache_kernel, W="*fp16", Bias="*fp16", X="*fp16", NW="*fp16", Pos="*i64", Slot="*i64",
        Cos="*fp16", Sin="*fp16", Q="*fp16", KC="*fp16", VC="*fp16", eps="fp32", kv_stride_h="i32",
        kv_stride_s="i32", H=1536, BLOCK_H=2048, HEADS=12, KV_HEADS=2, D=128, R=2, BK=512, PAGED=True, PDL=True),
    "b1 gate_up pdl": lambda: hopper_ptx(
        G._gate_up_silu_kernel, W="*fp16", X="*fp16", NW="*fp16", Out="*fp16", eps="fp32", I=8960, H=1536,
        BLOCK_H=2048, R=4, BK=256, PDL=True),
    "small linear pdl split 4": lambda: hopper_ptx(
        S._linear_kernel, W="*fp16", X="*fp16", NW="*fp16", Res="*fp16", Out="*fp16", N="i32", K=1536, NORM=False,
        RESIDUAL=True, BN=32, BK=128, SPLIT=4, **SMALL),
    "small gate_up pdl": lambda: hopper_ptx(
        S._gate_up_silu_kernel, W="*fp16", X="*fp16", NW="*fp16", Out="*fp16", I=8960, H=1536, R=32, BK=128,
        SPLIT=1, **SMALL),
    "small qkv pdl split 4": lambda: hopper_ptx(
        S._qkv_rope_cache_kernel, W="*fp16", Bias="*fp16", X="*fp16", NW="*fp16", Pos="*i64", Slots="*i64",
        Cos="*fp16", Sin="*fp16", Q="*fp16", KC="*fp16", VC="*fp16", kv_stride_b="i32", kv_stride_h="i32",
        kv_stride_s="i32", H=1536, HEADS=12, KV_HEADS=2, D=128, R=32, BK=256, SPLIT=4, HAS_BIAS=True, PAGED=True,
        **SMALL),
    "paged attention pdl": lambda: attention(True),
    "dense attention pdl": lambda: attention(False),
}

if __name__ == "__main__":
    json.dump({name: case() for name, case in CASES.items()}, sys.stdout)
