"""Where runs live on disk: one directory per engine, a row per run, the records of each run.

    results/<engine>/runs.jsonl, runs.csv     one summary row per run (metrics + provenance)
    results/<engine>/<run_id>/requests.jsonl.gz  the run's RequestRecords
    results/<engine>/<run_id>/passes.jsonl.gz    the run's PassRecords

Nothing half-written is ever mistaken for a whole run: a closed run's records are written into
a temporary directory that is renamed into place, and only then is its row appended; an open
run (`OpenRunWriter`) appends its records as they happen and compresses the pass log when it
ends, so an interrupted one stays readable up to the last record flushed. A run's row is what
makes it a run: a directory without one (a crash between the two) is ignored by readers and
replaced by the next run of that id. runs.jsonl is the record; runs.csv is derived from it,
rewritten whole after every row (`write_csv` regenerates it), so it never holds a row that
runs.jsonl lacks. Readers skip and name what a crash left damaged (a row cut short, a truncated
file) instead of failing on it.
"""
from __future__ import annotations

import gzip
import re
import shutil
import warnings
from collections import deque
from pathlib import Path
from typing import Callable, Iterable

from core.crash import crash_point
from core.records import PassRecord, RequestRecord, RowWriter, read_jsonl, records_to_csv, to_dict, write_jsonl

SAFE_RUN_ID = re.compile(r"^[A-Za-z0-9._-]+$")


def check_run_id(run_id: str) -> str:
    """Run ids name directories (and files fetched from a GPU machine): letters, digits, . _ -."""
    if not SAFE_RUN_ID.match(run_id):
        raise ValueError(f"run id {run_id!r} may hold only letters, digits, '.', '_' and '-'")
    return run_id


class RunStore:
    """The runs of one engine under `root` (e.g. results/batched)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @property
    def rows_path(self) -> Path:
        return self.root / "runs.jsonl"

    @property
    def csv_path(self) -> Path:
        return self.root / "runs.csv"

    def run_dir(self, run_id: str) -> Path:
        return self.root / check_run_id(run_id)

    def write_run(self, run_id: str, passes: Iterable[PassRecord], requests: Iterable[RequestRecord],
                  row: dict, extra: Callable[[Path], None] | None = None) -> None:
        """A finished run: its records (and whatever `extra(dir)` writes beside them) into
        <run_id>/ (complete, then renamed into place), then its row appended to runs.jsonl and
        runs.csv."""
        final = self.run_dir(run_id)
        tmp = self.root / f".{run_id}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            write_jsonl(passes, tmp / "passes.jsonl.gz")
            write_jsonl(requests, tmp / "requests.jsonl.gz")
            if extra is not None:
                extra(tmp)
            if final.exists():
                if any(r.get("run_id") == run_id for r in self.rows()):
                    raise ValueError(f"{final} exists already: run ids must be unique")
                shutil.rmtree(final)  # a run a crash left without its row
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        crash_point("run-dir")
        self.append_row(row)

    def append_row(self, row: dict) -> None:
        """`row` appended to runs.jsonl, then runs.csv rewritten from it."""
        with RowWriter(self.rows_path) as w:
            w.write(row)
        crash_point("run-row")
        self.write_csv()

    def write_csv(self) -> None:
        """runs.csv from runs.jsonl (every row, the columns of all of them in order of appearance)."""
        rows = self.rows()
        columns = list(dict.fromkeys(k for r in rows for k in r))
        records_to_csv([{k: r.get(k) for k in columns} for r in rows], self.csv_path)

    def rows(self) -> list[dict]:
        """Every complete row of runs.jsonl; a row a crash cut short is skipped with a warning."""
        if not self.rows_path.exists():
            return []
        return list(read_jsonl(self.rows_path, on_damage=lambda m: warnings.warn(f"skipped: {m}")))

    def passes(self, run_id: str) -> list[PassRecord]:
        path = self._records(run_id, "passes")
        return [PassRecord(**r) for r in read_jsonl(path, on_damage=lambda m: warnings.warn(f"cut short: {m}"))]

    def requests(self, run_id: str) -> list[RequestRecord]:
        path = self._records(run_id, "requests")
        return [RequestRecord(**r) for r in read_jsonl(path, on_damage=lambda m: warnings.warn(f"cut short: {m}"))]

    def _records(self, run_id: str, kind: str) -> Path:
        d = self.run_dir(run_id)
        for name in (f"{kind}.jsonl.gz", f"{kind}.jsonl"):
            if (d / name).exists():
                return d / name
        raise FileNotFoundError(f"{d}: no {kind} records (run {run_id!r} is missing or was cut short)")


class OpenRunWriter:
    """The records of a run that is still going (an open run of the continuous engine): request
    and pass records are kept as they come and written when the engine would otherwise wait
    (`write_while`: row by row while the GPU is still busy or the engine sleeps), so that turning
    a record into JSON never delays a pass; past `max_pending` unwritten records (an engine that
    never waits) they are written at once. `close` writes the rest and compresses both files."""

    def __init__(self, store: RunStore, run_id: str, max_pending: int = 4096):
        self.dir = store.run_dir(run_id)
        if self.dir.exists():
            if store.rows_path.exists() and any(r.get("run_id") == run_id for r in store.rows()):
                raise ValueError(f"{self.dir} exists already: run ids must be unique")
            shutil.rmtree(self.dir)  # a run a crash left without its row, as write_run replaces it
        self.requests = RowWriter(self.dir / "requests.jsonl")
        self.passes = RowWriter(self.dir / "passes.jsonl")
        self._pending: deque[tuple[RowWriter, object]] = deque()
        self.max_pending = max_pending

    def request(self, record: RequestRecord) -> None:
        self._keep(self.requests, record)

    def pass_done(self, record: PassRecord) -> None:
        self._keep(self.passes, record)

    def _keep(self, file: "RowWriter", record) -> None:
        self._pending.append((file, record))
        if len(self._pending) > self.max_pending:
            self.flush()

    def write_while(self, busy: Callable[[], bool]) -> None:
        """Write kept records one at a time for as long as `busy()` says the engine waits anyway."""
        wrote = set()
        while self._pending and busy():
            file, record = self._pending.popleft()
            file.append(to_dict(record))
            wrote.add(file)
        for file in wrote:
            file.flush()

    def flush(self) -> None:
        self.write_while(lambda: True)

    def close(self) -> None:
        """Flush, then replace each .jsonl by its .jsonl.gz (written whole, then renamed)."""
        self.flush()
        self.requests.close()
        self.passes.close()
        for name in ("passes", "requests"):
            plain = self.dir / f"{name}.jsonl"
            tmp = self.dir / f".{name}.jsonl.gz.partial"
            with open(plain, "rb") as src, gzip.open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst)
            tmp.replace(self.dir / f"{name}.jsonl.gz")
            plain.unlink()
