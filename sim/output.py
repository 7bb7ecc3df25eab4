"""Writing a run's files so that nothing half-written is ever left where a whole run belongs.

A run writes into a hidden temporary directory beside its `--out` directory and renames it into
place only when every file is complete; an interrupted or failed run leaves the old directory
as it was (and removes its temporary one). The destination is checked before any simulating:
a non-empty directory is refused unless `overwrite`, an unwritable place fails at once.

The request records go to `requests.jsonl` and `requests.csv` (the default), or
`requests.parquet` (`--format parquet`, for runs of millions of requests); `read_requests` reads
a run directory's records back from whichever is there, for `python -m sim metrics`.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from core.cli import check_writable_dir
from core.request_table import RequestTable
from core.table_io import WRITERS, pyarrow_or_error, read_table, write_table_parquet, write_table_text

FORMATS = tuple(WRITERS)  # jsonl, csv, parquet
DEFAULT_FORMATS = "jsonl,csv"


def check_out_dir(out: Path, overwrite: bool = False, resume: bool = False) -> None:
    """Refuse an --out that is a file, a non-empty directory (unless overwrite/resume), or a place
    this process cannot write to; before any work is done."""
    name_max = 255
    with contextlib.suppress(OSError, ValueError):
        name_max = os.pathconf(existing_parent(out), "PC_NAME_MAX")
    too_long = [part for part in out.parts if len(part) > name_max - RUN_TMP_EXTRA]
    if too_long:
        raise ValueError(f"--out: the name {too_long[0][:40]}... is {len(too_long[0])} characters long; at most "
                         f"{name_max - RUN_TMP_EXTRA} (the file system's {name_max}, less room for the run's "
                         "temporary directory beside it)")
    for place in (out, *out.parents):
        if place.is_symlink() and not place.exists():
            raise ValueError(f"--out {out}: {place} is a symbolic link to nowhere (or a loop); name a directory")
    if out.is_dir() and any(out.iterdir()) and not (overwrite or resume):
        raise ValueError(f"--out {out}: directory is not empty; pass --overwrite to replace what is there")
    check_writable_dir(out)
    check_writable_dir(out.parent, "--out")  # where the run's temporary directory goes


RUN_TMP_EXTRA = 32  # what atomic_dir's temporary name adds to --out's: ".NAME.<8 random>.partial", ".NAME.old.<pid>"


def existing_parent(path: Path) -> Path:
    """The nearest directory above `path` (or `path` itself) that exists."""
    parent = path.absolute()
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent


@contextlib.contextmanager
def atomic_dir(out: Path) -> Iterator[Path]:
    """A temporary directory to write a run's files into; on success it replaces `out`, on any
    error or interruption it is removed and `out` stays as it was."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists() and _exchange(tmp, out):  # out is the new run in one step; tmp holds the old one
        shutil.rmtree(tmp, ignore_errors=True)
        return
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old.{os.getpid()}")
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one step (Linux renameat2 with RENAME_EXCHANGE), so no moment is
    without `b`; False where the system or file system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    at_fdcwd, rename_exchange = -100, 2
    return renameat2 is not None and renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b),
                                                rename_exchange) == 0


def parse_formats(text: str) -> list[str]:
    """`--format jsonl,csv` -> ["jsonl", "csv"]; an unknown name, or parquet without pyarrow, is
    an error before any work."""
    formats = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise ValueError(f"--format {text!r}: choose one or more of {', '.join(FORMATS)}, comma-separated")
    if "parquet" in formats:
        try:
            pyarrow_or_error()
        except ValueError as e:
            raise ValueError(f"--format parquet: {e}") from None
    return list(dict.fromkeys(formats))


def write_requests(out: Path, table: RequestTable, formats: list[str]) -> None:
    """A run's request records as out/requests.<format> for each format (JSONL and CSV from one
    formatting of the numbers)."""
    if "jsonl" in formats or "csv" in formats:
        write_table_text(table, out / "requests.jsonl" if "jsonl" in formats else None,
                         out / "requests.csv" if "csv" in formats else None)
    if "parquet" in formats:
        write_table_parquet(table, out / "requests.parquet")


def read_requests(path: str | Path) -> RequestTable:
    """A run's request records: `path` is a run directory (`--out` of `python -m sim run`: its
    requests.parquet, requests.jsonl or requests.csv, the first there in that order) or one such
    file. `table.records()` gives RequestRecords; `core.metrics.compute_metrics` takes the table."""
    path = Path(path)
    if path.is_dir():
        for name in ("requests.parquet", "requests.jsonl", "requests.csv"):
            if (path / name).exists():
                return _read_records_file(path / name)
        raise ValueError(f"{path}: no requests.parquet, requests.jsonl or requests.csv (not a run's --out directory)")
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    return _read_records_file(path)


def read_left_out(path: str | Path) -> dict[str, list[int]]:
    """The trace rows its loader left out, by reason (their lines), as the run at `path` (a run
    directory or one of its request files) recorded them in metrics.json; empty without one."""
    path = Path(path)
    meta = (path if path.is_dir() else path.parent) / "metrics.json"
    if not meta.is_file():
        return {}
    left_out = json.loads(meta.read_text()).get("left_out") or {}
    return {reason: kind.get("lines", []) for reason, kind in left_out.items()}


def _read_records_file(path: Path) -> RequestTable:
    """One request-records file, any damage or foreign content refused naming the file and what is wrong."""
    try:
        table = read_table(path)
    except KeyError as e:
        raise ValueError(f"{path}: not request records written by python -m sim run (no field {e.args[0]})") from None
    except TypeError as e:
        what = str(e).split(": ", 1)[-1].replace("RequestRecord.__init__() ", "").replace(
            "core.records.RequestRecord() ", "")
        raise ValueError(f"{path}: not request records written by python -m sim run ({what})") from None
    except ValueError as e:
        text = str(e)
        raise ValueError(text if str(path) in text else f"{path}: not request records ({text})") from None
    if not len(table):
        raise ValueError(f"{path}: holds no request records")
    return table
