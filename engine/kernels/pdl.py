"""Programmatic dependent launch (PDL) for chains of small kernels on Hopper.

Launched with PDL, a kernel may be scheduled while the one before it is still running; it waits
(`griddepcontrol.wait`) before touching memory, so the launch latency between the two overlaps
with work instead of adding to it. Every kernel launched this way must call `pdl_wait` first.
The graph decoder turns it on for Hopper GPUs; it stays off on the CPU (Triton's interpreter
cannot run the instruction).
"""
from __future__ import annotations

import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # an older Triton: PDL stays off
    gdc_wait = gdc_launch_dependents = None


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait for the previous kernel's writes, then let the next kernel be scheduled."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


def pdl_available() -> bool:
    return gdc_wait is not None


def pdl_launch(enabled: bool) -> dict:
    """Launch options for a kernel: PDL on or off (constexpr PDL and the launch flag together)."""
    if enabled and gdc_wait is None:
        raise RuntimeError(f"this Triton ({triton.__version__}) has no programmatic dependent launch")
    return {"PDL": enabled, "launch_pdl": True} if enabled else {"PDL": False}
