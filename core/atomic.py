"""Files written whole or not at all: each is written to a temporary file beside its target,
flushed, then renamed over it in one step, so a reader (or a run killed mid-write) sees either the
old file or the new one, never a cut-short one."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator, Mapping


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs) -> Iterator[IO]:
    """Open a temporary file beside `path` for writing; on a clean exit it replaces `path`, on an
    exception it is removed and `path` is left as it was."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    """`path` holds `text`, or what it held before."""
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """`path` holds `data`, or what it held before."""
    with atomic_open(path, "wb") as f:
        f.write(data)


def write_together(texts: Mapping[str | os.PathLike, str], last: str | os.PathLike | None = None) -> None:
    """Write several files as one set: every one to its temporary file first, then the renames
    (`last`, if given, renamed after all the others: the file that says the set is complete).
    A failure before the renames leaves every file as it was."""
    order = sorted(texts, key=lambda p: Path(p) == Path(last) if last is not None else False)
    tmps: list[tuple[str, Path]] = []
    try:
        for path in order:
            path = Path(path)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            tmps.append((tmp, path))
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(texts[path] if path in texts else texts[str(path)])
                f.flush()
                os.fsync(f.fileno())
    except BaseException:
        for tmp, _ in tmps:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise
    for tmp, path in tmps:
        os.replace(tmp, path)
