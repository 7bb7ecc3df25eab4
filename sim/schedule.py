"""Decode attention as the kernel's programs run it: in launch order over the resident slots,
sharing the KV bandwidth (`sim.calibrated`'s form for batches that fill the GPU, when a
calibration file has "schedule" rates).

The kernel's grid is (rows, KV heads, slices); the GPU launches it slice by slice (every row's
slice 0 for each head, then every row's slice 1, ...), a program taking one slice of one
sequence's context for one head, programs past a context's end exiting at once. `resident`
programs run at a time; as one ends the next in launch order starts. The n running programs share
the bandwidth: each walks its blocks at min(1 / block_s, bandwidth / n) blocks a second, and a
program's start costs start_s at that pace's top. While many run the kernel is bandwidth-bound;
in its tail, when few are left (a spread batch's longest contexts' last slices, launched after
every row's earlier ones), it is latency-bound: what a batch of spread contexts costs over one of
its mean context.
"""
from __future__ import annotations

import heapq
from typing import Sequence

import numpy as np


def program_runs(lengths: Sequence[int], slice_lens: Sequence[int], block_n: int,
                 kv_heads: int) -> list[tuple[int, int]]:
    """The programs of a decode pass over sequences of `lengths` positions (the new token's
    included), cut into slices of `slice_lens` positions, in launch order as runs of (blocks, how
    many), programs past a sequence's end left out."""
    n = np.asarray(lengths, dtype=np.int64)
    sl = np.asarray(slice_lens, dtype=np.int64)
    live = -(-n // sl)
    out: list[tuple[int, int]] = []
    for k in range(int(live.max(initial=0))):
        rows = live > k
        blocks = -(-np.minimum(sl[rows], n[rows] - k * sl[rows]) // block_n)
        first = np.flatnonzero(np.concatenate(([True], blocks[1:] != blocks[:-1])))  # where runs of equal blocks begin
        counts = np.diff(np.append(first, len(blocks)))
        out.extend(list(zip(blocks[first].tolist(), counts.tolist())) * kv_heads)
    return out


def makespan(runs: Sequence[tuple[int, int]], bandwidth: float, block_s: float, start_s: float,
             resident: int) -> float:
    """Seconds the programs `runs` (blocks, how many; in launch order) take over `resident` slots,
    sharing `bandwidth` blocks a second, each no faster than a block per `block_s`, a start costing
    `start_s`. Exact: a run's programs launch together, and the slots count how many programs end
    at each point of the walk."""
    extra = start_s / block_s
    kept = [(blocks, count) for blocks, count in runs if blocks and count]
    works = [blocks + extra for blocks, _ in kept]
    counts = [count for _, count in kept]
    top = 1.0 / block_s
    ends: dict[float, int] = {}  # blocks every running program has walked when these end -> how many
    heap: list[float] = []
    k, last, running, free = 0, len(works), 0, resident
    done = clock = 0.0
    while True:
        while free and k < last:  # launch the next programs in order into the free slots
            count = counts[k]
            take = count if count < free else free
            end = done + works[k]
            if end in ends:
                ends[end] += take
            else:
                heapq.heappush(heap, end)
                ends[end] = take
            running += take
            free -= take
            if take == count:
                k += 1
            else:
                counts[k] = count - take
        if not heap:
            return clock
        end = heapq.heappop(heap)
        clock += (end - done) / min(top, bandwidth / running)
        done = end
        free = ends.pop(end)
        running -= free


def chunk_tile_runs(new_tokens: Sequence[int], context_lens: Sequence[int], tile_tokens: int, block_n: int,
                    kv_heads: int) -> list[tuple[int, int]]:
    """The chunk-attention kernel's programs (`engine/kernels/prefill_attention.py`) in launch order
    as runs of (blocks, how many): a tile of `tile_tokens` query tokens of one sequence and one KV
    head, a decode row a tile of its own; a sequence's tiles last first (the most keys), each
    reading its tokens' context and chunk up to its last token in blocks of `block_n`; one KV
    head's tiles, then the next's."""
    runs: list[list[int]] = []
    for n, c in zip(new_tokens, context_lens):
        tiles = -(-n // tile_tokens)
        for k in range(tiles, 0, -1):
            blocks = -(-(c + min(k * tile_tokens, n)) // block_n)
            if runs and runs[-1][0] == blocks:
                runs[-1][1] += 1
            else:
                runs.append([blocks, 1])
    return [(b, k) for b, k in runs] * kv_heads
