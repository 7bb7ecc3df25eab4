"""Loading and saving trace files: the project's CSV format, and the way into the public ones.

The project format is a CSV with header `arrival_s,prompt_tokens,output_tokens` and, optionally,
`request_id`, `priority` and `block_hashes` columns (in any order after the first three).
`arrival_s` is seconds (non-negative, non-decreasing), the token counts are whole numbers >= 1,
`priority` a whole number (lower runs first), `block_hashes` whole numbers separated by spaces in
one cell. The loader is strict: the first bad cell raises `TraceError` naming file and line, and
no `Trace` is built until every row has passed. Public formats (Azure, BurstGPT, Mooncake) are
converted by `traces.public`; `load_trace` picks the right reader from the header.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from traces.csvfile import ENCODING, integers, read_columns, read_header, require_columns, seconds
from traces.errors import TraceError
from traces.public import load_azure, load_burstgpt, load_mooncake
from traces.trace import Trace, first_out_of_order

__all__ = ["FORMATS", "TraceError", "detect_format", "load_trace", "save_trace"]

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
        return _load_project(path)
    if fmt == "azure":
        return load_azure(path)
    if fmt == "burstgpt":
        return load_burstgpt(path)
    if fmt == "mooncake":
        return load_mooncake(path)
    raise ValueError(f"unknown trace format {fmt!r}; expected one of {', '.join(FORMATS)}")


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
    crash never leaves half a trace behind). Arrival times keep full float64 precision."""
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
    tmp = path.with_name(path.name + ".tmp")
    pd.DataFrame(columns).to_csv(tmp, index=False, lineterminator="\n")
    tmp.replace(path)
    return path


def _load_project(path: Path) -> Trace:
    header = read_header(path)
    require_columns(path, header, REQUIRED, OPTIONAL)
    at_least_one = partial(integers, minimum=1)
    parsers = {"arrival_s": seconds, "prompt_tokens": at_least_one, "output_tokens": at_least_one,
               "request_id": _request_ids, "priority": integers, "block_hashes": _block_hashes}
    columns = read_columns(path, header, {c: parsers[c] for c in header},
                           text_columns=("request_id", "block_hashes"))
    _check_time_order(path, columns["arrival_s"])
    if "request_id" in columns:
        _check_unique(path, columns["request_id"])
    return Trace(arrival_s=columns["arrival_s"], prompt_tokens=columns["prompt_tokens"],
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


def _check_time_order(path: Path, arrival_s: np.ndarray) -> None:
    i = first_out_of_order(arrival_s)
    if i is not None:
        raise TraceError(path, _line(i), f"arrival_s {float(arrival_s[i])!r} is earlier than "
                                         f"{float(arrival_s[i - 1])!r} on line {_line(i - 1)}: the project "
                                         "format must be in time order (the public-format "
                                         "converters sort; this one does not guess)")


def _check_unique(path: Path, request_id: list[str]) -> None:
    seen: dict[str, int] = {}
    for row, rid in enumerate(request_id):
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
    if np.any(np.diff(trace.arrival_s) < 0):
        raise ValueError(f"{where}: arrival times must be non-decreasing")
    if trace.prompt_tokens.min() < 1 or trace.output_tokens.min() < 1:
        raise ValueError(f"{where}: token counts must be at least 1")
    if trace.request_id is not None and len(set(trace.request_id)) != len(trace):
        raise ValueError(f"{where}: request ids must be unique")
