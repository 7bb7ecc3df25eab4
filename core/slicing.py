"""How decode attention cuts each sequence's context into slices. The engine's kernel launches by
this rule (`engine.kernels.attention.PagedDecodeAttention`) and the simulator prices by it
(`sim.calibrated`, from a calibration file's `decode_attention`), so both read it from here."""
from __future__ import annotations


def decode_slicing(pairs: int, small: tuple[int, int], big: tuple[int, int], fills_gpu: int,
                   programs: int | None = None) -> tuple[int, int]:
    """(most slices a context, fewest positions a slice) of a launch of `pairs` (sequence, KV head)
    pairs: `big` once they fill the GPU (`fills_gpu` pairs or more); below, `small`, cut to fewer
    slices when `programs` is set, so that pairs x slices stays within about that many programs."""
    if pairs >= fills_gpu:
        return big[0], big[1]
    slices, shortest = small
    if programs:
        slices = max(1, min(slices, programs // max(pairs, 1)))
    return slices, shortest
