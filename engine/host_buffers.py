"""Pinned host memory a pass reuses, and CUDA events it reuses, instead of new ones every pass.

A pass sends a few small index arrays to the GPU and brings its sampled tokens back. Pinning a
fresh buffer and creating fresh events for each pass asks the driver for memory and events
hundreds of times a second; on a host shared by several replica processes such calls were
suspected of stalling a launch (`results/continuous/README.md`). Here each buffer is pinned
once and reused once the GPU has finished with it (an event recorded after its copy says when).
On a CPU device the same calls work on ordinary memory.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

ALIGN_BYTES = 16  # Triton specializes a kernel on whether each pointer is a multiple of this


class EventPool:
    """CUDA events handed out and taken back (one pass's start and end marks, copy fences)."""

    def __init__(self, enable_timing: bool):
        self.enable_timing, self.free = enable_timing, []

    def record(self) -> torch.cuda.Event:
        event = self.free.pop() if self.free else torch.cuda.Event(enable_timing=self.enable_timing)
        event.record()
        return event

    def release(self, *events) -> None:
        self.free.extend(events)


class Uploads:
    """Host arrays packed into one pinned buffer and copied to the device in one go. Buffers
    are used in turn; one is written again only after its previous copy has completed."""

    def __init__(self, device: torch.device, dtype: torch.dtype, slots: int = 4):
        self.device, self.dtype = device, dtype
        self.cuda = device.type == "cuda"
        self.buffers: list[Tensor | None] = [None] * slots
        self.copied = [torch.cuda.Event() if self.cuda else None for _ in range(slots)]
        self.next = 0

    def upload(self, parts: list[np.ndarray]) -> list[Tensor]:
        """`parts` concatenated, cast to the dtype, on the device: one view per part, each
        starting 16 bytes aligned (a kernel taking it compiles one variant, whatever the
        lengths of the parts before it)."""
        step = max(1, ALIGN_BYTES // torch.empty((), dtype=self.dtype).element_size())
        starts, at = [], 0
        for a in parts:
            starts.append(at)
            at += -(-a.size // step) * step
        n = at
        if not self.cuda:
            packed = torch.zeros(n, dtype=self.dtype)
        else:
            slot = self.next
            self.next = (slot + 1) % len(self.buffers)
            self.copied[slot].synchronize()  # the slot's last copy (none yet: returns at once)
            buffer = self.buffers[slot]
            if buffer is None or buffer.numel() < n:
                buffer = torch.empty(max(n, 2 * (buffer.numel() if buffer is not None else 0), 1024),
                                     dtype=self.dtype, pin_memory=True)
                self.buffers[slot] = buffer
            packed = buffer[:n]
        host = packed.numpy()
        for a, start in zip(parts, starts):
            np.copyto(host[start:start + a.size], a, casting="unsafe")
        if self.cuda:
            packed = packed.to(self.device, non_blocking=True)
            self.copied[slot].record()
        return [packed[start:start + a.size] for a, start in zip(parts, starts)]


class Downloads:
    """Pinned host buffers for a pass's sampled tokens: `start` copies them into a free one and
    returns it with the event that marks the copy done; `give_back` once they are read."""

    def __init__(self, size: int):
        self.size, self.free = size, []

    def start(self, sampled: Tensor) -> tuple[Tensor, torch.cuda.Event]:
        if self.free:
            buffer, done = self.free.pop()
        else:
            buffer, done = torch.empty(self.size, dtype=torch.long, pin_memory=True), torch.cuda.Event()
        n = sampled.numel()
        buffer[:n].copy_(sampled, non_blocking=True)
        done.record()
        return buffer, done

    def give_back(self, buffer: Tensor, done: torch.cuda.Event) -> None:
        self.free.append((buffer, done))
