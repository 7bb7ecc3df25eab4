"""Request records as columns: one numpy array per `RequestRecord` field, one row per request.

A run of millions of requests cannot keep an object per request (a `RequestRecord` and the
`Sequence` behind it take about a kilobyte); finished requests become rows of a `RequestTable`
instead, about 70 bytes each, and `core.metrics.compute_metrics` computes from its columns.
The conversion is lossless both ways (`from_records`, `records`), so the table is the same
records in another layout, not a second format.

Conventions: rows are in arrival order (a simulated run's trace order); a time that is None in a
record (`first_token_s`, `finish_s` of a rejected request) is NaN here; `rejected` keeps the
reasons of the few rejected rows by row number; `request_id` None means row i's id is str(i)
(a trace without ids); token times, when kept, are one flat array cut by `token_offsets`.
`queued_s` and `scheduled_s` (when the scheduler took a request in, when its first pass started)
are optional columns like the token times: a table keeps them (NaN: none) where its records
have them and, built from a run, only when the run keeps token times, so a run that does not
keeps its row of 72 bytes; a table without them gives None for both.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from core.records import RequestRecord

FLUSH_ROWS = 4096  # finished sequences buffered before they are turned into columns
FLOATS = ("arrival_s", "first_token_s", "finish_s", "itl_sum_s")  # the number columns, float64 (NaN: none)
INTS = ("prompt_tokens", "max_output_tokens", "output_tokens", "itl_count", "preemptions", "replica")  # int64
OPTIONAL = ("queued_s", "scheduled_s")  # float64 columns a table may lack (None), the last two fields


@dataclass
class RequestTable:
    """Columns of a run's request records (see the module's conventions)."""

    arrival_s: np.ndarray  # float64
    prompt_tokens: np.ndarray  # int64
    max_output_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    first_token_s: np.ndarray  # float64, NaN: none
    finish_s: np.ndarray  # float64, NaN: none
    itl_sum_s: np.ndarray  # float64
    itl_count: np.ndarray  # int64
    preemptions: np.ndarray  # int64
    replica: np.ndarray  # int64
    request_id: list[str] | None = None  # None: row i is request str(i)
    rejected: dict[int, str] = field(default_factory=dict)  # row -> reason
    run_id: str | list[str] = ""  # one for the table, or one per row
    token_times_s: np.ndarray | None = None  # float64, every row's token times one after the other
    token_offsets: np.ndarray | None = None  # int64, n + 1: row i's times are [offsets[i], offsets[i+1])
    queued_s: np.ndarray | None = None  # float64, NaN: none; None: not kept (every row's is None)
    scheduled_s: np.ndarray | None = None  # float64, NaN: none; None: not kept

    def __len__(self) -> int:
        return len(self.arrival_s)

    def ids(self, start: int = 0, stop: int | None = None) -> list[str]:
        """The request ids of rows start..stop."""
        stop = len(self) if stop is None else stop
        if self.request_id is None:
            return [str(i) for i in range(start, stop)]
        return list(self.request_id[start:stop])

    def run_ids(self, start: int = 0, stop: int | None = None) -> list[str]:
        stop = len(self) if stop is None else stop
        if isinstance(self.run_id, str):
            return [self.run_id] * (stop - start)
        return list(self.run_id[start:stop])

    def rejected_mask(self) -> np.ndarray:
        mask = np.zeros(len(self), dtype=bool)
        if self.rejected:
            mask[np.fromiter(self.rejected, np.int64, len(self.rejected))] = True
        return mask

    def completed_mask(self) -> np.ndarray:
        """RequestRecord.completed per row: not rejected and finished."""
        return ~self.rejected_mask() & ~np.isnan(self.finish_s)

    def token_lengths(self) -> np.ndarray:
        """How many token times each row keeps (0 everywhere when none are kept)."""
        if self.token_offsets is None:
            return np.zeros(len(self), dtype=np.int64)
        return np.diff(self.token_offsets)

    def token_times(self, row: int) -> list[float]:
        if self.token_offsets is None:
            return []
        return self.token_times_s[self.token_offsets[row]:self.token_offsets[row + 1]].tolist()

    # ---------------------------------------------------------------- records, both ways

    def records(self, start: int = 0, stop: int | None = None) -> list[RequestRecord]:
        """Rows start..stop as RequestRecords, exactly the records they were made from."""
        stop = len(self) if stop is None else stop
        cols = [c[start:stop].tolist() for c in (self.arrival_s, self.prompt_tokens, self.max_output_tokens,
                                                 self.output_tokens, self.first_token_s, self.finish_s,
                                                 self.itl_sum_s, self.itl_count, self.preemptions, self.replica)]
        cols += [[None] * len(cols[0]) if c is None else c[start:stop].tolist()
                 for c in (self.queued_s, self.scheduled_s)]
        out = []
        for row, (rid, run_id, arrival, prompt, max_out, out_tokens, first, finish, itl_sum, itl_count,
                  preemptions, replica, queued, scheduled) in enumerate(
                      zip(self.ids(start, stop), self.run_ids(start, stop), *cols), start):
            out.append(RequestRecord(
                request_id=rid, arrival_s=arrival, prompt_tokens=prompt, max_output_tokens=max_out,
                output_tokens=out_tokens, first_token_s=None if first != first else first,
                finish_s=None if finish != finish else finish, token_times_s=self.token_times(row),
                itl_sum_s=itl_sum, itl_count=itl_count, preemptions=preemptions,
                rejected=self.rejected.get(row), replica=replica, run_id=run_id,
                queued_s=None if queued != queued else queued,
                scheduled_s=None if scheduled != scheduled else scheduled))
        return out

    @classmethod
    def from_records(cls, records: Iterable[RequestRecord]) -> "RequestTable":
        """The records as columns, in their order (`queued_s` and `scheduled_s` kept when any
        record has one)."""
        records = list(records)
        times = [r.token_times_s for r in records]
        return cls.from_columns({name: [getattr(r, name) for r in records] for name in (*FLOATS, *INTS, *OPTIONAL)},
                                [r.request_id for r in records], [r.rejected for r in records],
                                [r.run_id for r in records], np.array([len(t) for t in times], dtype=np.int64),
                                np.array([x for t in times for x in t], dtype=np.float64))

    @classmethod
    def from_columns(cls, columns, ids: list[str], rejected: list, run_ids: list[str], lengths: np.ndarray,
                     values: np.ndarray) -> "RequestTable":
        """A table from per-row columns: `columns[name]` for each number field (a time that is
        None or NaN: none), the ids, each row's rejection reason (or None) and run id, and the
        token times as each row's count (`lengths`) and all rows' times one after the other.
        `queued_s` and `scheduled_s` may be absent (a file written before they were recorded):
        the table keeps each only where some row has one."""
        floats = {k: np.asarray(columns[k], dtype=np.float64) for k in FLOATS}
        ints = {k: np.asarray(columns[k], dtype=np.int64) for k in INTS}
        optional = {k: np.asarray(columns[k], dtype=np.float64) if k in columns else None for k in OPTIONAL}
        optional = {k: None if c is None or np.isnan(c).all() else c for k, c in optional.items()}
        kept = bool(lengths.any())
        return cls(**floats, **ints, **optional, request_id=ids,
                   rejected={i: r for i, r in enumerate(rejected) if r is not None},
                   run_id=run_ids[0] if run_ids and all(x == run_ids[0] for x in run_ids) else run_ids,
                   token_times_s=values if kept else None,
                   token_offsets=np.concatenate([[0], np.cumsum(lengths)]) if kept else None)


class TableBuilder:
    """Turns finished (or rejected) `core.scheduler.Sequence`s into table rows as they leave, a
    few thousand at a time, so that nothing per request outlives its request but its row.

    A sequence's row is its `index` (arrival order); `ids` says whether the trace had its own
    request ids (kept) or not (str(index), derived when needed). The row's fields are those of
    `Sequence.record()`; its token times, `queued_s` and `scheduled_s` only with `keep_token_times`
    (without them a row costs 72 bytes while the run goes: 4 floats and 5 ints).
    """

    def __init__(self, run_id: str = "", keep_token_times: bool = False, ids: bool = False, capacity: int = 1024):
        self.run_id = run_id
        self.keep_token_times = keep_token_times
        self.buffer: list = []
        self.count = 0
        self.rejected: dict[int, str] = {}
        capacity = max(1, capacity)
        # arrival, first token, last token, finish (and queued, scheduled with token times)
        self.floats = np.full((6 if keep_token_times else 4, capacity), np.nan)
        self.ints = np.zeros((5, capacity), dtype=np.int64)  # prompt, max output, num_tokens, preemptions, replica
        self.ids: list | None = [None] * capacity if ids else None
        self.times: list | None = [None] * capacity if keep_token_times else None

    def add(self, seq) -> None:
        self.buffer.append(seq)
        if len(self.buffer) >= FLUSH_ROWS:
            self.flush()

    def _grow(self, size: int) -> None:
        cap = self.floats.shape[1]
        if size <= cap:
            return
        new = max(size, 2 * cap)
        floats = np.full((self.floats.shape[0], new), np.nan)
        floats[:, :cap] = self.floats
        ints = np.zeros((self.ints.shape[0], new), dtype=np.int64)
        ints[:, :cap] = self.ints
        self.floats, self.ints = floats, ints
        if self.ids is not None:
            self.ids.extend([None] * (new - cap))
        if self.times is not None:
            self.times.extend([None] * (new - cap))

    def flush(self) -> None:
        buf = self.buffer
        if not buf:
            return
        self.buffer = []
        n = len(buf)
        index = np.fromiter([s.index for s in buf], np.int64, n)
        self._grow(int(index.max()) + 1)
        self.floats[0, index] = [s.arrival_s for s in buf]
        self.floats[1, index] = np.array([s.first_token_s for s in buf], dtype=np.float64)  # None -> NaN
        self.floats[2, index] = np.array([s.last_token_s for s in buf], dtype=np.float64)
        self.floats[3, index] = np.array([s.finish_s for s in buf], dtype=np.float64)
        if self.keep_token_times:
            self.floats[4, index] = np.array([s.queued_s for s in buf], dtype=np.float64)
            self.floats[5, index] = np.array([s.scheduled_s for s in buf], dtype=np.float64)
        self.ints[0, index] = [s.prompt_tokens for s in buf]
        self.ints[1, index] = [s.max_output_tokens for s in buf]
        self.ints[2, index] = [s.num_tokens for s in buf]
        self.ints[3, index] = [s.preemptions for s in buf]
        self.ints[4, index] = [s.replica for s in buf]
        for s in buf:
            if s.rejected is not None:
                self.rejected[s.index] = s.rejected
        if self.ids is not None:
            ids = self.ids
            for s in buf:
                ids[s.index] = s.request_id
        if self.times is not None:
            times = self.times
            for s in buf:
                times[s.index] = np.array(s.token_times if s.token_times is not None else (), dtype=np.float64)
        self.count += n

    def table(self) -> RequestTable:
        """Every row added, as a table (rows 0..count-1 must all have been added)."""
        self.flush()
        n = self.count
        f, i = self.floats[:, :n], self.ints[:, :n]
        if n < self.floats.shape[1]:  # trim the spare capacity (the columns below are views of these)
            f, i = f.copy(), i.copy()
        out = i[2] - i[0]  # num_tokens - prompt_tokens
        several = out > 1
        with np.errstate(invalid="ignore"):
            itl_sum = np.where(several, f[2] - f[1], 0.0)
        offsets = values = None
        if self.times is not None:
            lengths = np.fromiter((len(t) for t in self.times[:n]), np.int64, n)
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            values = np.concatenate(self.times[:n]) if n else np.zeros(0)
        return RequestTable(
            arrival_s=f[0], prompt_tokens=i[0], max_output_tokens=i[1], output_tokens=out,
            first_token_s=f[1], finish_s=f[3], itl_sum_s=itl_sum,
            itl_count=np.where(several, out - 1, 0), preemptions=i[3], replica=i[4],
            request_id=self.ids[:n] if self.ids is not None else None, rejected=dict(self.rejected),
            run_id=self.run_id, token_times_s=values, token_offsets=offsets,
            queued_s=f[4] if self.keep_token_times else None, scheduled_s=f[5] if self.keep_token_times else None)
