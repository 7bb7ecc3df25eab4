"""The padded sizes the engine's CUDA graphs are captured at (triton-free: the calibration sweep
and the tests read them on any install)."""
from __future__ import annotations


def graph_buckets(max_batch: int) -> list[int]:
    """Padded decode batch sizes a CUDA graph is captured for: 1, 2, 4, then every multiple of
    8 up to `max_batch` (vLLM's buckets), and `max_batch` itself."""
    sizes = [b for b in (1, 2, 4) if b < max_batch] + list(range(8, max_batch, 8)) + [max_batch]
    return sorted(set(sizes))


def powers_of_two(low: int, high: int) -> list[int]:
    """low, 2 low, 4 low, ... up to the first that reaches high."""
    out = [low]
    while out[-1] < high:
        out.append(out[-1] * 2)
    return out


def bucket_of(n: int, buckets: list[int]) -> int:
    """The smallest bucket that holds `n`."""
    return next(b for b in buckets if b >= n)


PREFILL_GRAPH_TOKENS = 8192  # prefill and mixed passes of more tokens launch kernel by kernel (GPU-bound anyway)
