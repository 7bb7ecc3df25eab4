"""Crash points for the interruption tests: `LLMSIM_CRASH_AT=NAME[:N]` (set only by tests) makes the
N-th pass (default the first) through `crash_point(NAME)` kill this process with SIGKILL, to check
what a crash at exactly that point leaves on disk."""
from __future__ import annotations

import os
import signal

ENV = "LLMSIM_CRASH_AT"
_passes: dict[str, int] = {}


def crash_point(name: str) -> None:
    """SIGKILL this process here when LLMSIM_CRASH_AT names this point (and this is its N-th pass)."""
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    point, _, count = wanted.partition(":")
    if point != name:
        return
    _passes[name] = _passes.get(name, 0) + 1
    if _passes[name] >= int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)
