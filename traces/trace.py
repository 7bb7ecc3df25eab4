"""The one in-memory trace: arrays of arrival times and token counts, one entry per request.

On disk a trace is a CSV `arrival_s,prompt_tokens,output_tokens` with optional columns
(`request_id`, `priority`, `block_hashes`); `traces.io` loads and validates it and converts the
public formats into it. Both the real engine and the simulator replay a `Trace`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Arrival times past this many seconds (about 3.2 years) are refused: float64 still resolves
# 15 ns there, so a token time never rounds into its neighbour.
MAX_ARRIVAL_S = 1e8

# What a converter leaves out of a public file, by its key in `Trace.notes` and its reason in words.
LEFT_OUT_REASONS = {"dropped_failed": "failed: zero output tokens", "dropped_zero_output": "zero output tokens",
                    "dropped_zero_prompt": "zero prompt tokens"}


def concat(chunks: list["Trace"], name: str) -> "Trace":
    """Consecutive chunks of one trace (as `traces.io.iter_trace` reads them) as one Trace."""
    if len(chunks) == 1:
        return chunks[0]

    def joined(column: str) -> list | None:
        parts = [getattr(c, column) for c in chunks]
        return None if parts[0] is None else [x for part in parts for x in part]

    priority = [c.priority for c in chunks]
    return Trace(arrival_s=np.concatenate([c.arrival_s for c in chunks]),
                 prompt_tokens=np.concatenate([c.prompt_tokens for c in chunks]),
                 output_tokens=np.concatenate([c.output_tokens for c in chunks]),
                 request_id=joined("request_id"), block_hashes=joined("block_hashes"),
                 priority=None if priority[0] is None else np.concatenate(priority), name=name)


def first_out_of_order(arrival_s: np.ndarray) -> int | None:
    """Index of the first arrival earlier than the one before it, or None when in time order."""
    back = np.flatnonzero(np.diff(arrival_s) < 0)
    return int(back[0]) + 1 if back.size else None


@dataclass
class Trace:
    """Requests in arrival order.

    arrival_s: seconds, non-decreasing (float64).
    prompt_tokens, output_tokens: positive token counts (int64).
    request_id: optional ids, unique.
    priority: optional integer priority per request (lower runs first).
    block_hashes: optional per-request list of prompt block hashes (prefix caching).
    name: where it came from, for messages and reports.
    notes: counts of what loading changed, for reports (e.g. {"dropped_failed": 12,
        "out_of_order": 3} from a public-format converter); empty for generated traces.
    left_out: the rows of the file the loader left out, by reason (LEFT_OUT_REASONS' words):
        their line numbers, ascending (int64); empty when every row is a request here.
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    request_id: list[str] | None = None
    priority: np.ndarray | None = None
    block_hashes: list[list[int]] | None = None
    name: str = "trace"
    notes: dict[str, int] = field(default_factory=dict)
    left_out: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.arrival_s = np.asarray(self.arrival_s, dtype=np.float64)
        self.prompt_tokens = np.asarray(self.prompt_tokens, dtype=np.int64)
        self.output_tokens = np.asarray(self.output_tokens, dtype=np.int64)
        n = len(self.arrival_s)
        for label, col in (("prompt_tokens", self.prompt_tokens), ("output_tokens", self.output_tokens),
                           ("request_id", self.request_id), ("priority", self.priority),
                           ("block_hashes", self.block_hashes)):
            if col is not None and len(col) != n:
                raise ValueError(f"{self.name}: {label} has {len(col)} entries, arrival_s has {n}")
        if self.priority is not None:
            self.priority = np.asarray(self.priority, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.arrival_s)

    def take(self, index: np.ndarray) -> "Trace":
        """The requests at `index` (integer positions or a boolean mask), optional columns kept
        (notes stay with the original); the tools use it so that no column is forgotten."""
        index = np.asarray(index)
        if index.dtype == bool:
            index = np.flatnonzero(index)
        return Trace(
            arrival_s=self.arrival_s[index],
            prompt_tokens=self.prompt_tokens[index],
            output_tokens=self.output_tokens[index],
            request_id=None if self.request_id is None else [self.request_id[i] for i in index],
            priority=None if self.priority is None else self.priority[index],
            block_hashes=None if self.block_hashes is None else [self.block_hashes[i] for i in index],
            name=self.name,
        )

    def check_arrivals(self) -> None:
        """Refuse arrival times a replay can't follow faithfully: not finite, negative, past
        MAX_ARRIVAL_S, or out of time order (token counts that are not positive are left to the
        schedulers, which reject those requests with the reason)."""
        a = self.arrival_s
        if not len(a):
            return
        if not np.isfinite(a).all():
            raise ValueError(f"{self.name}: arrival times must be finite numbers")
        if a.min() < 0:
            raise ValueError(f"{self.name}: arrival times must be >= 0, the first negative is {a.min():g} s")
        if a.max() > MAX_ARRIVAL_S:
            raise ValueError(f"{self.name}: an arrival at {a.max():g} s is past the {MAX_ARRIVAL_S:g} s "
                             f"this project replays (about 3.2 years)")
        i = first_out_of_order(a)
        if i is not None:
            raise ValueError(f"{self.name}: arrivals must be in time order, but request {i} arrives at "
                             f"{a[i]:g} s, before request {i - 1} at {a[i - 1]:g} s")

    def ids(self) -> list[str]:
        """Request ids: the trace's own, or the row index."""
        return self.request_id if self.request_id is not None else [str(i) for i in range(len(self))]

    @property
    def span_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    @property
    def rate(self) -> float:
        """Mean arrival rate, requests per second."""
        return (len(self) - 1) / self.span_s if self.span_s > 0 else float("nan")
