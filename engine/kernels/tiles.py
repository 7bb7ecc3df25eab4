"""The attention kernels' tiling rules, triton-free: the calibration reads them on any install."""
from __future__ import annotations

DECODE_SLICES = {False: (16, 128), True: (16, 1024)}  # (slices, fewest positions a slice), by "batch fills the GPU"
# Below FILLS_GPU a launch keeps to about DECODE_PROGRAMS programs: 16 slices a context up to 32
# (sequence, KV head) pairs, fewer beyond (core.slicing.decode_slicing; 4 at 128 pairs). The whole
# decode graph of Qwen2.5-1.5B on an H200 (benchmarks/profile_paged_decode.py part 5, batches 1, 4,
# 8, 16, 64 at 385, 1,025 and 4,097 cached positions, results/continuous-closed) against the 64
# slices of the rule before: at 4,097 positions b1 -2.9%, b4 -10.2%, b8 -7.8%, b16 -8.4%, b64 -16.1%;
# at 1,025 b64 -5.5%, the others within 0.7%; at 385 all within 0.6%. (Measured at 2 KV heads only.)
DECODE_PROGRAMS = 512
# (sequence, KV head) pairs from which a batch fills the GPU. Not 128: on an H200 at batch 64
# (128 pairs) of p256 contexts the first slicing's attention took 14.5 us a layer against the
# second's 19.9 (benchmarks/profile_paged_decode.py), and the sweep's batch-56 passes (first
# slicing) beat batch 64's (second) by 7-11% at 512-2,048 cached positions, losing 6% at 8,192.
FILLS_GPU = 256


def chunk_tile(group: int, max_query_len: int | None = None, block_m: int = 128) -> int:
    """Rows (token, query head) a tile: `block_m`, or fewer when no sequence brings enough tokens
    to fill it (a batch of decode tokens: 16 rows, two tokens of six heads)."""
    if max_query_len is not None:
        rows = max_query_len * group
        block_m = min(block_m, max(16, 1 << (rows - 1).bit_length()))  # triton.next_power_of_2
    assert group <= block_m, f"a tile of {block_m} rows cannot hold a group of {group} query heads"
    return block_m
