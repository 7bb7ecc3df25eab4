"""The one error a trace file raises: bad input, located by file and line."""
from __future__ import annotations

from pathlib import Path


class TraceError(ValueError):
    """A trace file that cannot be loaded. The message names the file, the 1-based line and the
    problem, so a user can open the file at that line and fix it."""

    def __init__(self, path: str | Path, line: int, problem: str) -> None:
        self.path = str(path)
        self.line = int(line)
        self.problem = problem
        super().__init__(f"{self.path}, line {self.line}: {problem}")


class NeedsSorting(TraceError):
    """A public-format file with a row earlier than the row before it, read a chunk at a time:
    its converter sorts a whole file, so it cannot stream (load it whole, or convert it once to
    the project format with `python -m traces convert`)."""
