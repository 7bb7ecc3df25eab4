"""Decode attention as the kernel's programs run it: in launch order over the resident slots,
sharing the KV bandwidth (`sim.calibrated`'s form for batches that fill the GPU, when a
calibration file has "schedule" rates; `benchmarks/attention_forms.py` fits it on
attention-alone timings, `benchmarks/fluid_priced.py` on whole passes).

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
from typing import Callable, Sequence


def program_runs(lengths: Sequence[int], slice_len: Callable[[int], int], block_n: int,
                 kv_heads: int) -> list[tuple[int, int]]:
    """The programs of a decode pass over sequences of `lengths` positions (the new token's
    included; `slice_len(L)`: the positions of a slice of a context of L), in launch order as runs
    of (blocks, how many), programs past a sequence's end left out."""
    sl = [slice_len(n) for n in lengths]
    live = [-(-n // s) for n, s in zip(lengths, sl)]
    out: list[tuple[int, int]] = []
    for k in range(max(live, default=0)):
        row: list[list[int]] = []
        for n, s, m in zip(lengths, sl, live):
            if k < m:
                blocks = -(-min(s, n - k * s) // block_n)
                if row and row[-1][0] == blocks:
                    row[-1][1] += 1
                else:
                    row.append([blocks, 1])
        out.extend([(b, c) for b, c in row] * kv_heads)
    return out


def makespan(runs: Sequence[tuple[int, int]], bandwidth: float, block_s: float, start_s: float,
             resident: int) -> float:
    """Seconds the programs `runs` (blocks, how many; in launch order) take over `resident` slots,
    sharing `bandwidth` blocks a second, each no faster than a block per `block_s`, a start costing
    `start_s`. Exact: a run's programs launch together, and the slots count how many programs end
    at each point of the walk."""
    extra = start_s / block_s
    queue = [[blocks + extra, count] for blocks, count in runs if blocks and count]
    ends: dict[float, int] = {}  # blocks every running program has walked when these end -> how many
    heap: list[float] = []
    k = running = 0
    done = clock = 0.0

    def launch(free: int) -> None:
        nonlocal k, running
        while free and k < len(queue):
            work, count = queue[k]
            take = min(count, free)
            end = done + work
            if end not in ends:
                heapq.heappush(heap, end)
            ends[end] = ends.get(end, 0) + take
            running, free = running + take, free - take
            if take == count:
                k += 1
            else:
                queue[k][1] = count - take

    launch(resident)
    while heap:
        end = heapq.heappop(heap)
        pace = min(1.0 / block_s, bandwidth / running)
        clock += (end - done) / pace
        done = end
        ended = ends.pop(end)
        running -= ended
        launch(ended)
    return clock
