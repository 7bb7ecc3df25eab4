"""The two records every run writes, real or simulated.

A *pass record* describes one forward pass of the model: which sequences went in, how many new
tokens each put through, how much context each attended to, and how long it took (measured with
CUDA events on a GPU, by the host clock on a CPU, or predicted by a cost model in the simulator).
The calibration fits its step-cost model on these records and the simulator writes the same ones.

A *request record* describes one request from arrival to its last token. Metrics (TTFT, TPOT,
ITL, E2EL, throughput, goodput) are computed from request records by `core.metrics`, whichever
side produced them.

Both are plain dataclasses, serialised one per line to JSONL (lists kept as JSON arrays) and to
CSV (lists joined with spaces). Times are seconds on the run's own clock (0 = run start).
"""
from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
import zlib
from typing import Callable, Iterable, Iterator, Literal, TextIO

from core.jsontext import dumps

PassKind = Literal["prefill", "decode", "mixed"]


def pass_kind(new_tokens: list[int], context_lens: list[int]) -> PassKind:
    """A sequence decodes when it puts one token through on top of a non-empty cache; anything
    else (a whole prompt, a prompt chunk, a full recompute without cache) is prefill work."""
    decoding = [n == 1 and c > 0 for n, c in zip(new_tokens, context_lens)]
    if all(decoding):
        return "decode"
    if not any(decoding):
        return "prefill"
    return "mixed"


@dataclass(slots=True)
class PassRecord:
    """One forward pass.

    Fields:
        run_id: the run this pass belongs to (joins with the run rows / request records).
        engine: engine or simulator that ran it ("naive", "cached", "batched", "sim", ...).
        step: index of the pass within its run, from 0.
        kind: "prefill", "decode" or "mixed", as `pass_kind` derives it.
        new_tokens: per sequence, the tokens this pass put through the model
            (the whole prompt for a prefill, 1 for a decode, the whole sequence for an engine
            without a KV cache).
        context_lens: per sequence, the tokens already held in the KV cache before this pass
            (so attention spans context_len + new_tokens positions).
        start_s: when the pass started, seconds since the run started.
        duration_s: how long the pass took, seconds.
        replica: which replica ran it (0 on a single engine).
        mode: how the engine ran it, e.g. "graph" (a CUDA graph replay), "triton" (the fused
            kernels launched one by one), "eager" (plain PyTorch); "" when not recorded.
        padded_to: the batch size a CUDA graph ran it at (its rows past the real batch are
            padding), 0 when not padded.
        host_s: host time spent planning the pass before its launch (the continuous engine).
        launch_s: host time spent launching it (staging its inputs, replaying or launching its
            kernels), after `start_s` was stamped on the GPU (the continuous engine; 0 when not
            recorded).
    """

    run_id: str
    engine: str
    step: int
    kind: PassKind
    new_tokens: list[int]
    context_lens: list[int]
    start_s: float
    duration_s: float
    replica: int = 0
    mode: str = ""
    padded_to: int = 0
    host_s: float = 0.0
    launch_s: float = 0.0

    @property
    def batch_size(self) -> int:
        return len(self.new_tokens)

    @property
    def num_tokens(self) -> int:
        """Tokens put through the model in this pass (the matmuls' M dimension)."""
        return sum(self.new_tokens)

    @classmethod
    def make(cls, run_id: str, engine: str, step: int, new_tokens: list[int],
             context_lens: list[int], start_s: float, duration_s: float,
             replica: int = 0) -> "PassRecord":
        """Build a record, deriving `kind` from the batch."""
        if len(new_tokens) != len(context_lens):
            raise ValueError(f"new_tokens has {len(new_tokens)} entries, context_lens {len(context_lens)}")
        return cls(run_id=run_id, engine=engine, step=step, kind=pass_kind(new_tokens, context_lens),
                   new_tokens=list(new_tokens), context_lens=list(context_lens), start_s=start_s,
                   duration_s=duration_s, replica=replica)


@dataclass(slots=True)
class RequestRecord:
    """One request, from arrival to completion or rejection.

    Fields:
        request_id: unique within the run.
        arrival_s: when the request arrived, seconds since the run started.
        prompt_tokens: prompt length in tokens.
        max_output_tokens: how many tokens were asked for.
        output_tokens: how many were produced (0 when rejected).
        first_token_s: when the first output token was ready (None if never).
        finish_s: when the last output token was ready (None if never).
        token_times_s: when each output token was ready, in order (len == output_tokens);
            left empty by producers that only keep the summary fields below.
        itl_sum_s / itl_count: the sum and count of inter-token gaps, always filled for a
            finished request, so mean ITL is known even when token_times_s is dropped.
        preemptions: how many times the request was preempted.
        rejected: None, or the reason the request was refused.
        replica: which replica served it.
        run_id: the run it belongs to.
        queued_s: when the serving engine's scheduler took the request in (the continuous
            engine: when its host loop picked it up, after the router's hand-over on several
            replicas, and a sleeping engine's wake-up; the simulator: on arrival, or with
            overlap when the plan that saw it was made), None if not recorded.
        scheduled_s: when the first pass that computed any of its tokens started on the device,
            None if not recorded or never scheduled. TTFT splits into intake (queued_s -
            arrival_s), queueing (scheduled_s - queued_s) and prefill (first_token_s -
            scheduled_s), as vLLM's queued and scheduled timestamps split it.
    """

    request_id: str
    arrival_s: float
    prompt_tokens: int
    max_output_tokens: int
    output_tokens: int = 0
    first_token_s: float | None = None
    finish_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    itl_sum_s: float = 0.0
    itl_count: int = 0
    preemptions: int = 0
    rejected: str | None = None
    replica: int = 0
    run_id: str = ""
    queued_s: float | None = None
    scheduled_s: float | None = None

    @property
    def completed(self) -> bool:
        return self.rejected is None and self.finish_s is not None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2el_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """vLLM's time per output token: (E2EL - TTFT) / (output_tokens - 1)."""
        if self.finish_s is None or self.first_token_s is None or self.output_tokens < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)

    def itls_s(self) -> list[float]:
        """Every gap between consecutive output tokens (empty if token times were not kept)."""
        t = self.token_times_s
        return [b - a for a, b in zip(t, t[1:])]

    def set_token_times(self, times: list[float]) -> None:
        """Record the output token times and derive first/finish/ITL summary from them."""
        self.token_times_s = list(times)
        self.output_tokens = len(times)
        if times:
            self.first_token_s = times[0]
            self.finish_s = times[-1]
            self.itl_sum_s = times[-1] - times[0]
            self.itl_count = len(times) - 1


# ---------------------------------------------------------------- serialisation


def to_dict(record) -> dict:
    """A record (or any dataclass) as a plain dict, ready for JSON."""
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}


def _csv_cell(value) -> object:
    if isinstance(value, list):
        return " ".join(repr(v) if isinstance(v, float) else str(v) for v in value)
    return "" if value is None else value


class RowWriter:
    """Appends rows to a JSONL file (and a CSV file beside it), flushing after every row so an
    interruption loses nothing already written: at worst the row being written is cut short,
    which `read_jsonl(..., on_damage=...)` skips and names. The JSONL file is the record; the CSV
    beside it has the columns of the rows so far (a row with new ones has it rewritten whole)."""

    def __init__(self, jsonl_path: str | Path, csv_path: str | Path | None = None):
        self.jsonl_path = Path(jsonl_path)
        self.jsonl_path.parent.mkdir(parents=True, exist_ok=True)
        cut_short = _ends_mid_line(self.jsonl_path)
        self._jsonl: TextIO = open(self.jsonl_path, "a", encoding="utf-8")
        if cut_short:  # a crash left half a row: end its line, so the rows after it stay whole
            self._jsonl.write("\n")
        self.csv_path = Path(csv_path) if csv_path else None
        self._csv: TextIO | None = None
        self._columns: list[str] | None = None
        if self.csv_path is not None and self.csv_path.exists() and self.csv_path.stat().st_size:
            with open(self.csv_path, newline="", encoding="utf-8") as f:
                self._columns = next(csv.reader(f))

    def append(self, row: dict) -> None:
        """A row to the JSONL file, not yet flushed (`flush` does; `write` does both); only for
        a writer without a CSV beside it."""
        assert self.csv_path is None, "append writes the JSONL file only"
        self._jsonl.write(dumps(row) + "\n")

    def flush(self) -> None:
        self._jsonl.flush()

    def write(self, row: dict) -> None:
        self._jsonl.write(dumps(row) + "\n")
        self._jsonl.flush()
        if self.csv_path is None:
            return
        if self._csv is None:
            new = self._columns is None
            self._csv = open(self.csv_path, "a", newline="", encoding="utf-8")
            if new:
                self._columns = list(row)
                csv.writer(self._csv).writerow(self._columns)
        if any(k not in self._columns for k in row):  # a row with new columns: the CSV is redone from the JSONL
            self._csv.close()
            rows = list(read_jsonl(self.jsonl_path, on_damage=lambda message: None))
            self._columns = list(dict.fromkeys(k for r in rows for k in r))
            records_to_csv([{k: r.get(k) for k in self._columns} for r in rows], self.csv_path)
            self._csv = open(self.csv_path, "a", newline="", encoding="utf-8")
            return
        csv.writer(self._csv).writerow([_csv_cell(row.get(k)) for k in self._columns])
        self._csv.flush()

    def close(self) -> None:
        self._jsonl.close()
        if self._csv is not None:
            self._csv.close()

    def __enter__(self) -> "RowWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _ends_mid_line(path: Path) -> bool:
    if not path.exists() or not path.stat().st_size:
        return False
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1) != b"\n"


def _open_text(path: Path, mode: str) -> TextIO:
    """A text file, gzip-compressed when its name ends in .gz."""
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def _replace_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """Write `path` through a temporary file beside it, renamed into place once complete, so a
    crash never leaves a half-written file under the real name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    try:
        write(tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def write_jsonl(records: Iterable, path: str | Path) -> None:
    """Write records (dataclasses or dicts) to a JSONL file (gzip-compressed when the name ends
    in .gz), replacing it atomically."""
    path = Path(path)
    text = "".join(dumps(r if isinstance(r, dict) else to_dict(r)) + "\n" for r in records)

    def write(tmp: Path) -> None:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(tmp, "wt", encoding="utf-8") as f:
            f.write(text)

    _replace_atomically(path, write)


def read_jsonl(path: str | Path, on_damage: Callable[[str], None] | None = None) -> Iterator[dict]:
    """Rows of a JSONL file (optionally .gz) as dicts. A damaged file (a line cut short, a
    truncated gzip stream) raises ValueError naming the file and line, unless `on_damage` is
    given: then `on_damage` gets the message, a damaged line is skipped, and a truncated gzip
    stream ends the rows there."""
    path = Path(path)
    line_no = 0
    try:
        with _open_text(path, "r") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    if on_damage is None:
                        raise ValueError(f"{path}:{line_no}: not valid JSON ({e})") from None
                    on_damage(f"{path}:{line_no}: not valid JSON, a row cut short ({e})")
                    continue
                yield row
    except (EOFError, gzip.BadGzipFile, zlib.error, UnicodeDecodeError) as e:
        message = f"{path}: damaged after line {line_no} ({e})"
        if on_damage is None:
            raise ValueError(message) from None
        on_damage(message)


def read_pass_records(path: str | Path, on_damage: Callable[[str], None] | None = None) -> list[PassRecord]:
    return [PassRecord(**row) for row in read_jsonl(path, on_damage)]


def read_request_records(path: str | Path, on_damage: Callable[[str], None] | None = None) -> list[RequestRecord]:
    return [RequestRecord(**row) for row in read_jsonl(path, on_damage)]


def records_to_csv(records: Iterable, path: str | Path) -> None:
    """Write records to CSV (lists as space-separated cells), replacing the file atomically."""
    rows = [r if isinstance(r, dict) else to_dict(r) for r in records]
    buf = io.StringIO()
    if rows:
        w = csv.writer(buf)
        w.writerow(list(rows[0]))
        w.writerows([_csv_cell(v) for v in row.values()] for row in rows)
    _replace_atomically(Path(path), lambda tmp: tmp.write_text(buf.getvalue(), encoding="utf-8"))
