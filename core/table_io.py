"""A `RequestTable` to and from files: JSONL and CSV exactly as `core.records` writes request
records (byte for byte), and Parquet (columnar, about a tenth of the JSONL) when pyarrow is
installed (`pip install 'llm-serving-sim[parquet]'`).

Writers go a block of rows at a time, so a run of millions of requests never holds its whole
text in memory; each file is written beside its name and renamed into place when complete.
`read_table` reads any of the three back into a table (`.jsonl`, `.jsonl.gz`, `.csv`, `.parquet`).
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import gzip
import json
from json.encoder import encode_basestring_ascii as json_string
from pathlib import Path
from typing import Callable

import numpy as np

from core.records import RequestRecord, _replace_atomically, read_request_records
from core.request_table import FLOATS, INTS, OPTIONAL, RequestTable

BLOCK_ROWS = 65_536
COLUMNS = [f.name for f in dataclasses.fields(RequestRecord)]
PARQUET_EXTRA = "pip install 'llm-serving-sim[parquet]' (or pip install pyarrow)"

_JSON_ROW = ('{"request_id": %s, "arrival_s": %s, "prompt_tokens": %s, "max_output_tokens": %s, '
             '"output_tokens": %s, "first_token_s": %s, "finish_s": %s, "token_times_s": %s, "itl_sum_s": %s, '
             '"itl_count": %s, "preemptions": %s, "rejected": %s, "replica": %s, "run_id": %s, "queued_s": %s, '
             '"scheduled_s": %s}\n')
_NUMBERS = (*FLOATS, *INTS, *OPTIONAL)  # the columns written as numbers


def pyarrow_or_error():
    """pyarrow and pyarrow.parquet, or a ValueError saying how to install them."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise ValueError(f"Parquet needs pyarrow, which is not installed: {PARQUET_EXTRA}") from None
    return pyarrow, pyarrow.parquet


def _blocks(table: RequestTable):
    for lo in range(0, len(table), BLOCK_ROWS):
        yield lo, min(lo + BLOCK_ROWS, len(table))


def _numbers(table: RequestTable, lo: int, hi: int) -> dict[str, list[str]]:
    """Rows lo..hi (lo < hi) of the number columns as text: Python's repr of each value, as
    json and csv write them ("nan" for a time that is None, and for every row of an optional
    column the table does not keep)."""
    def text(column) -> list[str]:
        return ["nan"] * (hi - lo) if column is None else repr(column[lo:hi].tolist())[1:-1].split(", ")
    return {name: text(getattr(table, name)) for name in _NUMBERS}


def _none_as(column: list[str], none: str) -> list[str]:
    return [none if x == "nan" else x for x in column]


def _token_times(table: RequestTable, lo: int, hi: int, fmt: Callable[[list[float]], str]) -> list[str]:
    if table.token_offsets is None:
        return [fmt([])] * (hi - lo)
    o, values = table.token_offsets, table.token_times_s
    return [fmt(values[o[i]:o[i + 1]].tolist()) for i in range(lo, hi)]


def _rejected(table: RequestTable, lo: int, hi: int, none, fmt: Callable[[str], str]) -> list:
    column = [none] * (hi - lo)
    for row, reason in table.rejected.items():
        if lo <= row < hi:
            column[row - lo] = fmt(reason)
    return column


def _json_lines(table: RequestTable, lo: int, hi: int, numbers: dict[str, list[str]]) -> str:
    ids = [f'"{i}"' for i in range(lo, hi)] if table.request_id is None else \
        [json_string(x) for x in table.request_id[lo:hi]]
    run_ids = [json_string(x) for x in table.run_ids(lo, hi)] if not isinstance(table.run_id, str) else \
        [json_string(table.run_id)] * (hi - lo)
    n = numbers
    return "".join(_JSON_ROW % row for row in zip(
        ids, n["arrival_s"], n["prompt_tokens"], n["max_output_tokens"], n["output_tokens"],
        _none_as(n["first_token_s"], "null"), _none_as(n["finish_s"], "null"),
        _token_times(table, lo, hi, lambda t: "[" + ", ".join(map(repr, t)) + "]"), n["itl_sum_s"],
        n["itl_count"], n["preemptions"], _rejected(table, lo, hi, "null", json_string), n["replica"], run_ids,
        _none_as(n["queued_s"], "null"), _none_as(n["scheduled_s"], "null")))


def _csv_rows(table: RequestTable, lo: int, hi: int, numbers: dict[str, list[str]]):
    n = numbers
    return zip(table.ids(lo, hi), n["arrival_s"], n["prompt_tokens"], n["max_output_tokens"], n["output_tokens"],
               _none_as(n["first_token_s"], ""), _none_as(n["finish_s"], ""),
               _token_times(table, lo, hi, lambda t: " ".join(map(repr, t))), n["itl_sum_s"], n["itl_count"],
               n["preemptions"], _rejected(table, lo, hi, "", str), n["replica"], table.run_ids(lo, hi),
               _none_as(n["queued_s"], ""), _none_as(n["scheduled_s"], ""))


def write_table_text(table: RequestTable, jsonl: str | Path | None = None, csv_path: str | Path | None = None) -> None:
    """The table as request records in JSONL (as `core.records.write_jsonl` writes them) and/or
    CSV (as `core.records.records_to_csv` does), both from one formatting of the numbers."""
    paths = [Path(p) for p in (jsonl, csv_path) if p is not None]
    tmps = [p.with_name(f".{p.name}.partial") for p in paths]
    try:
        files = []
        for p, tmp in zip(paths, tmps):
            p.parent.mkdir(parents=True, exist_ok=True)
            opener = gzip.open if p.suffix == ".gz" else open
            files.append(opener(tmp, "wt", encoding="utf-8", newline="" if p.suffix == ".csv" else None))
        with contextlib.ExitStack() as stack:
            for f in files:
                stack.enter_context(f)
            json_file = files[0] if jsonl is not None else None
            csv_writer = csv.writer(files[-1]) if csv_path is not None else None
            if csv_writer is not None and len(table):
                csv_writer.writerow(COLUMNS)
            for lo, hi in _blocks(table):
                numbers = _numbers(table, lo, hi)
                if json_file is not None:
                    json_file.write(_json_lines(table, lo, hi, numbers))
                if csv_writer is not None:
                    csv_writer.writerows(_csv_rows(table, lo, hi, numbers))
        for p, tmp in zip(paths, tmps):
            tmp.replace(p)
    finally:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)


def write_table_jsonl(table: RequestTable, path: str | Path) -> None:
    """The table as request records in JSONL, as `core.records.write_jsonl` writes them."""
    write_table_text(table, jsonl=path)


def write_table_csv(table: RequestTable, path: str | Path) -> None:
    """The table as request records in CSV, as `core.records.records_to_csv` writes them."""
    write_table_text(table, csv_path=path)


def write_table_parquet(table: RequestTable, path: str | Path) -> None:
    """The table as a Parquet file: one column per RequestRecord field (times that are None are
    nulls, token times a list column; `queued_s` and `scheduled_s` all nulls when the table does
    not keep them), a row group per block of rows."""
    pa, pq = pyarrow_or_error()
    schema = pa.schema([("request_id", pa.string()), ("arrival_s", pa.float64()), ("prompt_tokens", pa.int64()),
                        ("max_output_tokens", pa.int64()), ("output_tokens", pa.int64()),
                        ("first_token_s", pa.float64()), ("finish_s", pa.float64()),
                        ("token_times_s", pa.large_list(pa.float64())), ("itl_sum_s", pa.float64()),
                        ("itl_count", pa.int64()), ("preemptions", pa.int64()), ("rejected", pa.string()),
                        ("replica", pa.int64()), ("run_id", pa.string()), ("queued_s", pa.float64()),
                        ("scheduled_s", pa.float64())])

    def nullable(column, lo: int, hi: int):
        if column is None:
            return pa.nulls(hi - lo, pa.float64())
        return pa.array(column[lo:hi], mask=np.isnan(column[lo:hi]))

    def write(tmp: Path) -> None:
        with pq.ParquetWriter(tmp, schema) as w:
            for lo, hi in _blocks(table):
                if table.token_offsets is None:
                    offsets, values = np.zeros(hi - lo + 1, dtype=np.int64), np.zeros(0)
                else:
                    o = table.token_offsets[lo:hi + 1]
                    offsets, values = o - o[0], table.token_times_s[o[0]:o[-1]]
                rejected = _rejected(table, lo, hi, None, str)
                w.write_batch(pa.record_batch([
                    pa.array(table.ids(lo, hi), pa.string()), table.arrival_s[lo:hi], table.prompt_tokens[lo:hi],
                    table.max_output_tokens[lo:hi], table.output_tokens[lo:hi],
                    nullable(table.first_token_s, lo, hi), nullable(table.finish_s, lo, hi),
                    pa.LargeListArray.from_arrays(offsets, values), table.itl_sum_s[lo:hi], table.itl_count[lo:hi],
                    table.preemptions[lo:hi], pa.array(rejected, pa.string()), table.replica[lo:hi],
                    pa.array(table.run_ids(lo, hi), pa.string()), nullable(table.queued_s, lo, hi),
                    nullable(table.scheduled_s, lo, hi)], schema=schema))

    _replace_atomically(Path(path), write)


WRITERS = {"jsonl": write_table_jsonl, "csv": write_table_csv, "parquet": write_table_parquet}


def read_table(path: str | Path) -> RequestTable:
    """Request records from a .jsonl (or .jsonl.gz), .csv or .parquet file, as a table."""
    path = Path(path)
    if path.name.endswith((".jsonl", ".jsonl.gz")):
        return RequestTable.from_records(read_request_records(path))
    if path.suffix == ".csv":
        return _read_csv(path)
    if path.suffix == ".parquet":
        return _read_parquet(path)
    raise ValueError(f"{path}: not a request-records file (.jsonl, .jsonl.gz, .csv or .parquet)")


def _read_csv(path: Path) -> RequestTable:
    import pandas as pd
    text = {"request_id": str, "token_times_s": str, "rejected": str, "run_id": str}
    exact = {"float_precision": "round_trip"} if int(pd.__version__.split(".")[0]) < 3 else {}  # pandas 3: the default
    empty = {name: [""] for name in ("first_token_s", "finish_s", *OPTIONAL)}  # a time that is None
    frame = pd.read_csv(path, dtype=text, keep_default_na=False, na_values=empty, **exact)
    times = [[float(x) for x in cell.split()] for cell in frame["token_times_s"]]
    lengths = np.array([len(t) for t in times], dtype=np.int64)
    values = np.array([x for t in times for x in t], dtype=np.float64)
    return RequestTable.from_columns(frame, frame["request_id"].tolist(),  # (an older file lacks OPTIONAL's)
                                     [r if r else None for r in frame["rejected"]], frame["run_id"].tolist(),
                                     lengths, values)


def _read_parquet(path: Path) -> RequestTable:
    pa, pq = pyarrow_or_error()
    import pyarrow.compute as pc
    t = pq.read_table(path)
    times = t.column("token_times_s").combine_chunks()
    lengths = np.asarray(pc.list_value_length(times).to_numpy(zero_copy_only=False), dtype=np.int64)
    present = [name for name in COLUMNS if name in t.column_names]  # (an older file lacks OPTIONAL's)
    columns = {name: t.column(name).to_numpy(zero_copy_only=False) for name in present
               if name not in ("request_id", "token_times_s", "rejected", "run_id")}
    return RequestTable.from_columns(columns, t.column("request_id").to_pylist(), t.column("rejected").to_pylist(),
                                     t.column("run_id").to_pylist(), lengths,
                                     np.asarray(times.flatten().to_numpy(), dtype=np.float64))
