"""The fused Triton kernels; `choose_kernels` is the one place that decides whether they can run.

The kernel modules import triton at their top, so nothing outside this package imports them
before `choose_kernels` said "triton": PyTorch's CPU build ships without triton, and every engine
then runs its eager kernels.
"""
from __future__ import annotations

import functools
import importlib.util
import sys

NO_TRITON = "triton is not installed: the engine runs its eager kernels (slower; timings are not the GPU's)"


@functools.cache
def triton_available() -> bool:
    """Whether triton can be imported (it is absent from PyTorch's CPU build)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # blocked or half-installed: as good as absent
        return False


@functools.cache
def _say_no_triton() -> None:
    print(NO_TRITON, file=sys.stderr)


def choose_kernels(requested: str) -> str:
    """`requested` ("triton" or "eager"), or "eager" when triton is asked for but not installed
    (said once on stderr per process, so a CPU install runs every engine)."""
    if requested == "triton" and not triton_available():
        _say_no_triton()
        return "eager"
    return requested
