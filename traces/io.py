"""Loading and saving trace files: the project's CSV format, and the way into the public ones.

The project format is a CSV with header `arrival_s,prompt_tokens,output_tokens` and, optionally,
`request_id`, `priority` and `block_hashes` columns (in any order after the first three).
`arrival_s` is seconds (non-negative, non-decreasing), the token counts are whole numbers >= 1,
`priority` a whole number (lower runs first), `block_hashes` whole numbers separated by spaces in
one cell. The loader is strict: the first bad cell raises `TraceError` naming file and line, and
no `Trace` is built until every row has passed. Public formats (Azure, BurstGPT, Mooncake) are
converted by `traces.public`; `load_trace` picks the right reader from the header.

`iter_trace` reads a file a chunk of rows at a time, each chunk a checked `Trace`, so a trace
larger than memory can stream through a replay; `load_trace` is the same chunks joined (the same
checks, the same error lines). A public file streams only if it is in time order (its converter
sorts a whole file): a row out of order raises `NeedsSorting` with its line.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from core.atomic import atomic_open
from traces.csvfile import ENCODING, integers, iter_columns, read_header, require_columns, seconds
from traces.errors import NeedsSorting, TraceError
from traces.public import iter_public, load_azure, load_burstgpt, load_mooncake
from traces.trace import MAX_ARRIVAL_S, Trace, concat, first_out_of_order

__all__ = ["FORMATS", "NeedsSorting", "TraceError", "count_trace", "detect_format", "iter_trace", "load_trace",
           "save_trace"]

FORMATS = ("project", "azure", "burstgpt", "mooncake")
REQUIRED = ["arrival_s", "prompt_tokens", "output_tokens"]
OPTIONAL = ["request_id", "priority", "block_hashes"]


def load_trace(path: str | Path, fmt: str | None = None) -> Trace:
    """Load a trace file in the project format or a public one (`fmt` in FORMATS; None detects
    it from the header or the .jsonl extension)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such trace file")
    fmt = fmt or detect_format(path)
    if fmt == "project":
        return concat(list(_project_chunks(path, None)), path.stem)
    if fmt == "azure":
        return load_azure(path)
    if fmt == "burstgpt":
        return load_burstgpt(path)
    if fmt == "mooncake":
        return load_mooncake(path)
    raise ValueError(f"unknown trace format {fmt!r}; expected one of {', '.join(FORMATS)}")


def iter_trace(path: str | Path, fmt: str | None = None, chunk_rows: int | None = None,
               left_out: dict[str, np.ndarray] | None = None) -> Iterator[Trace]:
    """The trace in `path` as checked chunks of at most `chunk_rows` requests (default
    `traces.csvfile.CHUNK_ROWS`), read as they are asked for: `load_trace`'s checks and error
    lines, a chunk at a time. A public-format file must be in time order (else `NeedsSorting`).
    `left_out`, if given, is filled as the file is read with the lines of the rows the loader
    leaves out, by reason (as `Trace.left_out`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such trace file")
    fmt = fmt or detect_format(path)
    if fmt == "project":
        return _project_chunks(path, chunk_rows)
    if fmt in FORMATS:
        return iter_public(path, fmt, chunk_rows, left_out)
    raise ValueError(f"unknown trace format {fmt!r}; expected one of {', '.join(FORMATS)}")


def count_trace(path: str | Path, fmt: str | None = None, left_out: dict[str, np.ndarray] | None = None) -> int:
    """Requests in a trace file, every row checked on the way, in memory for one chunk at a time
    (`left_out`, if given, is filled as `iter_trace` fills it)."""
    return sum(len(chunk) for chunk in iter_trace(path, fmt, left_out=left_out))


def detect_format(path: str | Path) -> str:
    """Which format a file is in, from its extension or the column names on its first line."""
    path = Path(path)
    if path.suffix == ".jsonl":
        return "mooncake"
    with open(path, encoding=ENCODING, errors="replace", newline="") as f:
        first = f.readline()
    if first.lstrip().startswith("{"):
        return "mooncake"
    header = set(read_header(path))
    if "arrival_s" in header:
        return "project"
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= header:
        return "azure"
    if {"Timestamp", "Request tokens", "Response tokens"} <= header:
        return "burstgpt"
    raise TraceError(path, 1, f"cannot tell the trace format from the header {first.strip()!r}; "
                              f"pass the format explicitly (one of {', '.join(FORMATS)})")


def save_trace(trace: Trace, path: str | Path) -> Path:
    """Write `trace` as a project-format CSV (written to a temporary file, then renamed, so a
    crash never leaves half a trace behind), refusing one `load_trace` would refuse. Arrival
    times keep full float64 precision."""
    _check_writable(trace)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns: dict[str, object] = {"arrival_s": trace.arrival_s, "prompt_tokens": trace.prompt_tokens,
                                  "output_tokens": trace.output_tokens}
    if trace.request_id is not None:
        columns["request_id"] = trace.request_id
    if trace.priority is not None:
        columns["priority"] = trace.priority
    if trace.block_hashes is not None:
        columns["block_hashes"] = [" ".join(map(str, hashes)) for hashes in trace.block_hashes]
    with atomic_open(path, "w", encoding="utf-8", newline="") as f:
        pd.DataFrame(columns).to_csv(f, index=False, lineterminator="\n")
    return path


def _project_chunks(path: Path, chunk_rows: int | None) -> Iterator[Trace]:
    header = read_header(path)
    require_columns(path, header, REQUIRED, OPTIONAL)
    at_least_one = partial(integers, minimum=1)
    parsers = {"arrival_s": seconds, "prompt_tokens": at_least_one, "output_tokens": at_least_one,
               "request_id": _request_ids, "priority": integers, "block_hashes": _block_hashes}
    before: tuple[float, int] | None = None  # the previous chunk's last arrival and its line
    seen: dict[str, int] = {}  # request id -> row, across chunks
    for columns in iter_columns(path, header, {c: parsers[c] for c in header},
                                text_columns=("request_id", "block_hashes"), chunk_rows=chunk_rows):
        first_row = columns["line"] - 2
        arrival_s = columns["arrival_s"]
        _check_time_order(path, arrival_s, first_row, before)
        if "request_id" in columns:
            _check_unique(path, columns["request_id"], first_row, seen)
        before = (float(arrival_s[-1]), first_row + len(arrival_s) - 1)
        yield Trace(arrival_s=arrival_s, prompt_tokens=columns["prompt_tokens"],
                    output_tokens=columns["output_tokens"], request_id=columns.get("request_id"),
                    priority=columns.get("priority"), block_hashes=columns.get("block_hashes"),
                    name=path.stem)


def _line(row: int) -> int:
    """The line of data row `row` (0-based): the header is line 1 and blank lines are refused."""
    return row + 2


def _request_ids(col: pd.Series, path: Path, what: str) -> list[str]:
    blank = (col.str.strip() == "").to_numpy()
    if blank.any():
        raise TraceError(path, int(col.index[blank.argmax()]), f"missing {what}")
    replaced = col.str.contains("\ufffd", regex=False).to_numpy()  # where a byte was not UTF-8
    if replaced.any():
        line, cell = int(col.index[replaced.argmax()]), col[col.index[replaced.argmax()]]
        raise TraceError(path, line, f"{what} {cell!r} holds bytes that are not UTF-8 (or U+FFFD, which stands "
                                     "for them)")
    return col.tolist()


def _block_hashes(col: pd.Series, path: Path, what: str) -> list[list[int]]:
    hashes = []
    for line, cell in col.items():
        try:
            hashes.append([int(h) for h in cell.split()])
        except ValueError:
            raise TraceError(path, line, f"{what} must be whole numbers separated by spaces, "
                                         f"got {cell!r}") from None
    return hashes


def _check_time_order(path: Path, arrival_s: np.ndarray, first_row: int = 0,
                      before: tuple[float, int] | None = None) -> None:
    """Rows first_row.. (`arrival_s`) in time order, also after `before` (the previous row's
    arrival and row)."""
    if before is not None and arrival_s[0] < before[0]:
        i, earlier, earlier_row = 0, before[0], before[1]
    else:
        i = first_out_of_order(arrival_s)
        if i is None:
            return
        earlier, earlier_row = float(arrival_s[i - 1]), first_row + i - 1
    raise TraceError(path, _line(first_row + i), f"arrival_s {float(arrival_s[i])!r} is earlier than "
                                                 f"{earlier!r} on line {_line(earlier_row)}: the project "
                                                 "format must be in time order (the public-format "
                                                 "converters sort; this one does not guess)")


def _check_unique(path: Path, request_id: list[str], first_row: int = 0, seen: dict[str, int] | None = None) -> None:
    seen = {} if seen is None else seen
    for row, rid in enumerate(request_id, first_row):
        if rid in seen:
            raise TraceError(path, _line(row), f"request_id {rid!r} already used on line "
                                               f"{_line(seen[rid])}")
        seen[rid] = row


def _check_writable(trace: Trace) -> None:
    """Refuse to write a file that `load_trace` would refuse to read."""
    where = f"trace {trace.name!r}"
    if len(trace) == 0:
        raise ValueError(f"{where} has no requests")
    if not np.all(np.isfinite(trace.arrival_s)) or trace.arrival_s.min() < 0:
        raise ValueError(f"{where}: arrival times must be finite and non-negative")
    if trace.arrival_s.max() > MAX_ARRIVAL_S:
        raise ValueError(f"{where}: an arrival at {trace.arrival_s.max():.6g} s is past {MAX_ARRIVAL_S:g} s (about "
                         "3.2 years), the longest trace the loader reads; nothing written")
    if np.any(np.diff(trace.arrival_s) < 0):
        raise ValueError(f"{where}: arrival times must be non-decreasing")
    if trace.prompt_tokens.min() < 1 or trace.output_tokens.min() < 1:
        raise ValueError(f"{where}: token counts must be at least 1")
    if trace.request_id is not None and len(set(trace.request_id)) != len(trace):
        raise ValueError(f"{where}: request ids must be unique")
