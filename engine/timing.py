"""Timestamps for passes without stopping the GPU: CUDA events on a GPU, resolved once at the end
of a run; the host clock on a CPU (where every op is synchronous anyway)."""
from __future__ import annotations

import time

import torch


class Clock:
    """`mark()` stamps "now" on the device's timeline and returns its index; `seconds()` turns all
    stamps into seconds since the first one, synchronising once."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._marks: list = []

    def mark(self) -> int:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(time.perf_counter())
        return len(self._marks) - 1

    def seconds(self) -> list[float]:
        if not self._marks:
            return []
        if self.cuda:
            self._marks[-1].synchronize()
            first = self._marks[0]
            return [first.elapsed_time(e) / 1e3 for e in self._marks]
        return [t - self._marks[0] for t in self._marks]
