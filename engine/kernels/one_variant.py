"""`triton.jit` for kernels whose integer arguments and index pointers change from pass to pass.

Triton compiles a variant of a kernel for each combination of its integer arguments being 1 or a
multiple of 16 and its pointers being 16-byte aligned. A kernel launched outside a CUDA graph
(passes of more tokens than the largest prefill graph) with a new batch's sequence count, block
table width or index-array offsets compiles a new variant mid-run: 0.2 to 0.9 s of a stalled
pass on the H200, the first time each combination appears. `one_variant` tells Triton not to
specialize on the named arguments, so such a kernel compiles once, whatever the batch.
"""
from __future__ import annotations

import inspect

import triton

_ALIGNMENT_FLAG = "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters


def one_variant(ints: tuple[str, ...] = (), pointers: tuple[str, ...] = ()):
    """A `triton.jit` decorator that specializes on none of `ints` (values) nor `pointers`
    (alignment; a Triton without that option still specializes on it, which only costs extra
    compiles)."""
    options = {"do_not_specialize": list(ints)}
    if _ALIGNMENT_FLAG and pointers:
        options["do_not_specialize_on_alignment"] = list(pointers)
    return triton.jit(**options)
