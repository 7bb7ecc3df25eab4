"""Writing a run's files so that nothing half-written is ever left where a whole run belongs.

A run writes into a hidden temporary directory beside its `--out` directory and renames it into
place only when every file is complete; an interrupted or failed run leaves the old directory
as it was (and removes its temporary one). The destination is checked before any simulating:
a non-empty directory is refused unless `overwrite`, an unwritable place fails at once.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


def check_out_dir(out: Path, overwrite: bool = False, resume: bool = False) -> None:
    """Refuse an --out that is a file, a non-empty directory (unless overwrite/resume), or a place
    this process cannot write to; before any work is done."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (overwrite or resume):
        raise ValueError(f"--out {out}: directory is not empty; pass --overwrite to replace what is there")
    parent = out.parent if not out.exists() else out
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: cannot write in {parent}")


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
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old.{os.getpid()}")
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
