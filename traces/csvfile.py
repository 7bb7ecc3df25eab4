"""Reading CSV traces fast and strictly: every cell checked, every error located by line.

Files are read with pandas in chunks of `CHUNK_ROWS` rows, so that a week-long production trace
(tens of millions of rows) loads in bounded memory with vectorised checks. Each chunk is indexed
by the 1-based line number of its rows (the header is line 1), so a bad cell's line is its index.

`read_columns` reads a file twice only when it must: first letting pandas parse numbers in C
(fast); if a number column then has the wrong type (a word, a blank, a fraction), again with
every cell as text, where the parsers find and name the first bad cell. Nothing here builds a
`Trace`: callers get whole checked columns and assemble the trace at the end (all-or-nothing).
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pandas as pd

from traces.errors import TraceError
from traces.trace import MAX_ARRIVAL_S

CHUNK_ROWS = 1_000_000
ENCODING = "utf-8-sig"  # tolerate the byte-order mark spreadsheet programs write

Parser = Callable[[pd.Series, Path, str], "np.ndarray | list"]


class _NeedsText(Exception):
    """A number column came back with the wrong type: re-read as text to name the bad cell."""


def read_header(path: Path) -> list[str]:
    """The column names on line 1, stripped; an error for an empty file or a repeated name."""
    with open(path, encoding=ENCODING, errors="replace", newline="") as f:
        first = f.readline()
    names = [name.strip() for name in first.rstrip("\r\n").split(",")]
    if not first:
        raise TraceError(path, 1, "the file is empty (expected a header line)")
    if names == [""]:
        raise TraceError(path, 1, "the header line is blank")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise TraceError(path, 1, f"column {repeated[0]!r} appears more than once in the header")
    return names


def require_columns(path: Path, header: list[str], required: list[str],
                    optional: list[str] | None = None) -> None:
    """Check the header has every required column, and, if `optional` is given, nothing else."""
    missing = [c for c in required if c not in header]
    if missing:
        raise TraceError(path, 1, f"missing column {missing[0]!r} (header is {','.join(header)!r}; "
                                  f"expected {','.join(required)})")
    if optional is not None:
        unknown = [c for c in header if c not in required and c not in optional]
        if unknown:
            raise TraceError(path, 1, f"unknown column {unknown[0]!r} (allowed: "
                                      f"{', '.join(required + optional)})")


def read_columns(path: Path, header: list[str], parsers: dict[str, Parser],
                 text_columns: tuple[str, ...] = ()) -> dict[str, np.ndarray | list]:
    """Each column named in `parsers`, parsed and checked over the whole file; `text_columns`
    are never parsed as numbers by pandas (times, ids, hash lists)."""
    parts: dict[str, list] = {name: [] for name in parsers}
    for columns in iter_columns(path, header, parsers, text_columns):
        for name in parts:
            parts[name].append(columns[name])
    return {name: np.concatenate(p) if isinstance(p[0], np.ndarray) else [x for part in p for x in part]
            for name, p in parts.items()}


def iter_columns(path: Path, header: list[str], parsers: dict[str, Parser], text_columns: tuple[str, ...] = (),
                 chunk_rows: int | None = None) -> Iterator[dict[str, np.ndarray | list]]:
    """`read_columns` a chunk of rows at a time (`chunk_rows`, default CHUNK_ROWS): each chunk's
    columns parsed and checked, with its first line number under the key "line". A number column
    of the wrong type makes the reading start over with every cell as text (the chunks already
    given are not given again), so errors come out as `read_columns` names them."""
    given = 0
    try:
        for columns in _parsed_chunks(path, header, parsers, text_columns, False, chunk_rows):
            yield columns
            given += 1
    except _NeedsText:
        for i, columns in enumerate(_parsed_chunks(path, header, parsers, text_columns, True, chunk_rows)):
            if i >= given:
                yield columns


def _parsed_chunks(path: Path, header: list[str], parsers: dict[str, Parser], text_columns: tuple[str, ...],
                   as_text: bool, chunk_rows: int | None) -> Iterator[dict]:
    for chunk in data_chunks(path, header, text_columns, as_text, chunk_rows):
        columns = {name: parse(chunk[name], path, name) for name, parse in parsers.items()}
        columns["line"] = int(chunk.index[0])
        yield columns


def data_chunks(path: Path, header: list[str], text_columns: tuple[str, ...] = (),
                as_text: bool = True, chunk_rows: int | None = None) -> Iterator[pd.DataFrame]:
    """The data rows a chunk at a time (`chunk_rows`, default CHUNK_ROWS), indexed by line
    number; at least one row. With `as_text` every cell is a string, else pandas infers number
    columns.

    Blank lines are errors, except at the very end of the file (editors leave them there).
    """
    _check_first_row(path, header)
    text = str if as_text else {c: str for c in text_columns if c in header}
    reader = pd.read_csv(path, dtype=text,
                         keep_default_na=False, na_filter=False, skip_blank_lines=False,
                         index_col=False, chunksize=chunk_rows or CHUNK_ROWS, encoding=ENCODING,
                         encoding_errors="replace")  # bytes that are not UTF-8 fail as bad cells
    first_blank = None  # line of a blank row that only more blank rows may follow
    rows = 0
    try:
        for chunk in reader:
            chunk.columns = header
            chunk.index = chunk.index + 2
            blank = (chunk == "").all(axis=1).to_numpy()
            data = np.flatnonzero(~blank)
            if first_blank is not None and data.size:
                raise TraceError(path, first_blank, "blank line in the middle of the data")
            if blank.any():
                b = int(np.flatnonzero(blank)[0])
                if data.size and data[-1] > b:
                    raise TraceError(path, int(chunk.index[b]), "blank line in the middle of the data")
                first_blank = int(chunk.index[b])
                chunk = chunk.iloc[:b]
            if len(chunk):
                rows += len(chunk)
                yield chunk
    except pd.errors.ParserError as e:  # e.g. "Expected 3 fields in line 5, saw 4"
        line = _line_in_message(str(e))
        raise TraceError(path, line, f"malformed row: {_tail(str(e))}") from None
    if rows == 0:
        raise TraceError(path, 2, "no requests after the header")


def _check_first_row(path: Path, header: list[str]) -> None:
    """pandas, with index_col=False, drops the cells past the header's on the first data row with
    only a warning; refuse them there as it refuses them on every later row."""
    with open(path, encoding=ENCODING, errors="replace", newline="") as f:
        rows = csv.reader(f)
        next(rows, None)
        first = next(rows, None)
    if first is not None and len(first) > len(header):
        raise TraceError(path, 2, f"malformed row: Expected {len(header)} fields in line 2, saw {len(first)}")


def _line_in_message(message: str) -> int:
    words = message.replace(",", " ").split()
    for word, nxt in zip(words, words[1:]):
        if word == "line" and nxt.isdigit():
            return int(nxt)
    return 0


def _tail(message: str) -> str:
    return message.split("error: ")[-1].strip()


def _first_bad(col: pd.Series, bad: np.ndarray) -> tuple[int, str]:
    i = int(np.flatnonzero(bad)[0])
    return int(col.index[i]), str(col.iloc[i]).strip()


def _check_present(col: pd.Series, path: Path, what: str) -> None:
    empty = (col.str.strip() == "").to_numpy()
    if empty.any():
        line, _ = _first_bad(col, empty)
        raise TraceError(path, line, f"missing {what}")


def integers(col: pd.Series, path: Path, what: str, minimum: int | None = None) -> np.ndarray:
    """Whole numbers written as such ("12", not "12.0" or "1e3"), at least `minimum` if given."""
    if col.dtype.kind == "i":
        values = col.to_numpy(dtype=np.int64)
    elif col.dtype.kind in "fub":  # parsed as numbers, but not all whole: find out on the text
        raise _NeedsText
    else:
        values = _integers_from_text(col, path, what)
    if minimum is not None:
        low = values < minimum
        if low.any():
            line, text = _first_bad(col, low)
            kind = "is negative" if int(text) < 0 else f"must be at least {minimum}"
            raise TraceError(path, line, f"{what} {kind}, got {text}")
    return values


def _integers_from_text(col: pd.Series, path: Path, what: str) -> np.ndarray:
    col = col.astype(str)  # pandas may hand over Python ints too big for int64
    values = pd.to_numeric(col, errors="coerce")
    if values.dtype.kind != "i":
        _check_present(col, path, what)
        bad = ~col.str.fullmatch(r"\s*-?\d{1,18}\s*").to_numpy(dtype=bool)
        if bad.any():
            line, text = _first_bad(col, bad)
            raise TraceError(path, line, f"{what} must be a whole number, got {text!r}")
        values = col.str.strip().astype(np.int64)
    return values.to_numpy(dtype=np.int64)


def seconds(col: pd.Series, path: Path, what: str) -> np.ndarray:
    """Finite, non-negative numbers of seconds."""
    if col.dtype.kind in "iuf":
        values = col.to_numpy(dtype=np.float64)
    elif col.dtype.kind == "b":  # "True"/"False" parsed as booleans: no times
        raise _NeedsText
    else:
        col = col.astype(str)
        values = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        if col.dtype.kind not in "iuf":
            _check_present(col, path, what)
        line, text = _first_bad(col, bad)
        raise TraceError(path, line, f"{what} must be a finite number of seconds, got {text!r}")
    negative = values < 0
    if negative.any():
        line, text = _first_bad(col, negative)
        raise TraceError(path, line, f"{what} is negative, got {text}")
    late = values > MAX_ARRIVAL_S
    if late.any():
        line, text = _first_bad(col, late)
        raise TraceError(path, line, f"{what} {text} is past {MAX_ARRIVAL_S:g} s (about 3.2 years), "
                                     "the longest trace this project replays")
    return values


def timestamps_ns(col: pd.Series, path: Path, what: str) -> np.ndarray:
    """Wall-clock times like `2023-11-16 18:15:46.6805900` or `2024-05-10 00:00:00.00993+00:00`
    as int64 nanoseconds since the epoch (UTC when no offset is written). Parsed as integers so
    that 100 ns digits survive: float64 seconds since 1970 keep only about 0.2 microseconds."""
    times = pd.to_datetime(col, format="ISO8601", utc=True, errors="coerce")
    bad = times.isna().to_numpy()
    if bad.any():
        _check_present(col, path, what)
        line, text = _first_bad(col, bad)
        raise TraceError(path, line, f"{what} {text!r} is not a date and time "
                                     "like 2023-11-16 18:15:46.6805900")
    return times.dt.as_unit("ns").astype("int64").to_numpy()
