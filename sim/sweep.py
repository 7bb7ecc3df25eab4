"""A grid of runs (the RunSpec axes x seeds) in parallel processes.

Every grid point runs once per replication (seeds seed, seed+1, ...); each run is one row of
metrics, appended to `runs.csv` as soon as it finishes, so an interrupted sweep keeps every
finished run and `--resume` runs only the missing ones. Points with several replications get a
mean and confidence interval per metric (`summary.csv`, written when the sweep ends or is stopped with
Ctrl-C).

`sweep.json`, written when a sweep starts, records the options it was made with (all but the
axes' values, --replications and how it runs: --jobs, --modal); `--resume` refuses other options,
so runs.csv never mixes rows of two sweeps. A sweep removes summary.csv before it writes a row
(`--overwrite`: before it removes anything else), so summary.csv never stands beside rows it
does not summarize. A last row a crash cut short is dropped on resume, and its point runs again.
"""
from __future__ import annotations

import csv
import io
import itertools
import json
import shutil
import sys
from pathlib import Path
from typing import Iterable, Sequence

from tqdm import tqdm

from core.atomic import atomic_open, write_text
from core.crash import crash_point
from core.metrics import summarize_replications
from sim.build import AXES, TEXT_AXES, RunSpec
from sim.fanout import runner

RECORD = "sweep.json"
NOT_RECORDED = ("command", "jobs", "modal", "out", "overwrite", "resume", "replications", *AXES)  # how, not what
FLAGS = {"fast_forward": "--no-fast-forward"}  # options whose flag is not --NAME
SHOWN = ["request_throughput", "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms"]


def grid(base: RunSpec, replications: int = 1, **axes: Sequence) -> list[RunSpec]:
    """One spec per combination of the axes' values (unnamed axes keep `base`'s value) and
    replication, the replication's seed being base.seed + its index."""
    names = [name for name, values in axes.items() if values]
    specs = []
    for values in itertools.product(*(axes[n] for n in names)):
        point = base.with_(**dict(zip(names, values)))
        specs.extend(point.with_(seed=base.seed + i) for i in range(replications))
    return specs


def _key(row: dict) -> tuple:
    """A run's place in the grid, as text (so rows read back from runs.csv match)."""
    return tuple("" if row[k] is None else str(float(row[k]) if k in ("rate", "rate_scale") else row[k])
                 for k in (*AXES, "seed"))


def sweep_record(options: dict, axes: dict, replications: int) -> dict:
    """What sweep.json holds: the options that shape every row (`options` less NOT_RECORDED, as
    JSON values), and, for the reader, the axes' values and the replications."""
    def plain(value):
        return json.loads(json.dumps(value, default=str))
    return {"options": {k: plain(v) for k, v in options.items() if k not in NOT_RECORDED},
            "axes": plain(axes), "replications": replications}


def check_resume(out: Path, record: dict) -> None:
    """Before any work: may `out` be resumed with the options of `record`? Refused (one line
    naming each option that differs, then and now) if out's sweep.json records others, or if out
    holds runs but no sweep.json (a sweep from before it was recorded), or runs.csv lacks a column."""
    path = out / RECORD
    if path.exists():
        try:
            then = json.loads(path.read_text(encoding="utf-8"))["options"]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"--resume: {path}: not a sweep's record ({e}); start again with --overwrite") from None
        now = record["options"]
        differ = [f"{FLAGS.get(k, '--' + k.replace('_', '-'))} {then[k]!r} then, {now[k]!r} now"
                  for k in now if k in then and then[k] != now[k]]
        if differ:
            raise ValueError(f"--resume: {out} was swept with other options: {'; '.join(differ)} (resume it with "
                             f"those, or start again with --overwrite or in another --out)")
    elif (out / "runs.csv").exists():
        raise ValueError(f"--resume: {out} has runs.csv but no {RECORD} (a sweep from an older version), so its "
                         f"options cannot be checked; start it again with --overwrite or in another --out")
    _read_done(out / "runs.csv")  # a runs.csv without a column a row needs fails here


def _cut_tail(text: str) -> tuple[str, bool]:
    """runs.csv's text less a last row a crash cut short (no line end, or too few cells), and
    whether there was one."""
    lines = text.splitlines(keepends=True)
    if not lines:
        return text, False
    last = lines[-1]
    cells = next(csv.reader([last]), [])
    header = next(csv.reader([lines[0]]), [])
    if last.endswith("\n") and (len(lines) == 1 or len(cells) == len(header)):
        return text, False
    return "".join(lines[:-1]), True


def _read_done(path: Path, repair: bool = False) -> list[dict]:
    """runs.csv's rows as the values written; a last row cut short is left out (with `repair`:
    dropped from the file too, with a note)."""
    if not path.exists():
        return []
    text, cut = _cut_tail(path.read_text(encoding="utf-8"))
    if cut and repair:
        write_text(path, text)
        print(f"note: {path}: its last row was cut short (an interrupted write); dropped, its point runs again",
              file=sys.stderr)
    reader = csv.DictReader(io.StringIO(text, newline=""))
    rows = list(reader)
    missing = [k for k in (*AXES, "seed") if k not in (reader.fieldnames or [])]
    if rows and missing:
        raise ValueError(f"{path}: no column {missing[0]} (written by an older version of the simulator); "
                         f"start the sweep in a new --out")
    return [{k: (v if k in TEXT_AXES else None if v == "" else _number(v)) for k, v in r.items()} for r in rows]


def _start(out: Path, record: dict | None, resume: bool) -> None:
    """Make `out` this sweep's folder before its first row: summary.csv removed first (it
    summarizes the rows there now), then (not resuming: --overwrite) everything else, then
    sweep.json written."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.csv").unlink(missing_ok=True)
    if not resume:
        crash_point("sweep-overwrite")
        (out / "runs.csv").unlink(missing_ok=True)
        for entry in out.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    if record is not None and not (resume and (out / RECORD).exists()):
        write_text(out / RECORD, json.dumps(record, indent=1) + "\n")


def _number(text: str) -> int | float:
    """A runs.csv cell as the value that was written: an int (a count, a seed) or a float."""
    try:
        return int(text)
    except ValueError:
        return float(text)


class _RowFile:
    """runs.csv, appended a row at a time and flushed, the header fixed by the first row."""

    def __init__(self, path: Path | None):
        self.path, self.file, self.writer = path, None, None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            fresh = not path.exists() or path.stat().st_size == 0
            self.header = None
            if not fresh:
                with open(path, newline="") as f:
                    self.header = next(csv.reader(f))
            self.file = open(path, "a", newline="")

    def write(self, row: dict) -> None:
        if self.file is None:
            return
        if self.writer is None:
            if self.header is None:
                self.header = list(row)
                csv.writer(self.file).writerow(self.header)
            self.writer = csv.DictWriter(self.file, self.header, extrasaction="ignore")
        self.writer.writerow(row)
        self.file.flush()
        crash_point("sweep-row")

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def sweep(specs: list[RunSpec], slos: dict[str, float] | None = None, jobs: int | None = None,
          progress: bool = True, out: Path | None = None, resume: bool = False,
          mapper=None, record: dict | None = None) -> tuple[list[dict], bool]:
    """Run every spec, `jobs` at a time in worker processes (1: in this process), or through
    `mapper` (`sim.fanout.runner`: modal_app.py's simulate_point.map), appending each row to
    out/runs.csv as it finishes (`record`: out/sweep.json, see `sweep_record`). Returns the rows
    (with those already there when resuming) and whether the sweep completed; Ctrl-C stops the
    workers at once and keeps what finished."""
    runs_csv = out / "runs.csv" if out is not None else None
    rows: list[dict] = []
    complete, total = True, len(specs)
    try:
        with runner(jobs, mapper) as run:
            if out is not None:
                _start(out, record, resume)
            if resume and runs_csv is not None:
                rows = _read_done(runs_csv, repair=True)
                done = {_key(r) for r in rows}
                specs = [s for s in specs if _key(vars(s)) not in done]
                total = len(specs) + len(rows)
            bar = tqdm(total=total, initial=len(rows), desc="sweep", unit="run", disable=not progress)
            sink = _RowFile(runs_csv)
            try:
                for row in run(specs, slos):
                    rows.append(row)
                    sink.write(row)
                    bar.update()
            finally:
                sink.close()
                bar.close()
    except KeyboardInterrupt:
        complete = False
        where = (f"kept in {runs_csv}; run the same command with --resume to finish the grid" if runs_csv
                 else "not kept (no --out)")
        print(f"\ninterrupted: {len(rows)} of {total} runs done, {where}")
    return sorted(rows, key=lambda r: tuple((r[k] is None, r[k] or 0) for k in (*AXES, "seed"))), complete


def summarize(rows: list[dict], metrics: Iterable[str], level: float = 0.95) -> list[dict]:
    """One row per grid point: each metric's mean and confidence-interval half-width (`_ci`)."""
    metrics = list(metrics)
    points: dict[tuple, list[dict]] = {}
    for row in rows:
        points.setdefault(tuple(row[k] for k in AXES), []).append(row)
    out = []
    for key, reps in points.items():
        summary = dict(zip(AXES, key))
        summary["replications"] = len(reps)
        for m, (mean, half) in summarize_replications(reps, metrics, level).items():
            summary[m] = mean
            summary[f"{m}_ci"] = half
        out.append(summary)
    return out


def print_summary(rows: list[dict], axes: dict, slos: dict | None, out: Path | None) -> None:
    """The grid as a table (only the axes that vary), and summary.csv under `out`."""
    if not rows:
        return
    import pandas as pd
    metrics = SHOWN + (["request_goodput"] if slos else [])
    table = pd.DataFrame(summarize(rows, metrics))
    fixed = [c for c in (*axes, "replications") if table[c].nunique(dropna=False) == 1]
    shown = table.drop(columns=fixed + [c for c in table if c.endswith("_ci") and table[c].isna().all()]
                       + [a for a in AXES if a not in axes])
    print(", ".join(f"{c}={table[c].iloc[0]}" for c in fixed))
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.float_format", "{:.2f}".format):
        print(shown.to_string(index=False))
    if out is not None:
        with atomic_open(out / "summary.csv", "w", newline="") as f:
            table.to_csv(f, index=False)
        print(f"written {out / 'runs.csv'} and {out / 'summary.csv'}")
