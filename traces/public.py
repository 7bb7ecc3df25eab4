"""Converters from the public production-trace formats into a `Trace`.

Every converter checks every row (bad cells raise `TraceError` with the file and line), then:
- drops requests with a zero token count, counts them in `trace.notes` and names their lines by
  reason in `trace.left_out` (BurstGPT marks failed requests with 0 response tokens; a zero
  elsewhere cannot be replayed either), so that a replay can say what it left out;
- SORTS by arrival time (stable), because raw public files need not be in order, and counts in
  `notes["out_of_order"]` the rows that came earlier than the row before them;
- sets `arrival_s` to seconds since the first kept request, refusing a request past MAX_ARRIVAL_S
  (a file the project loader would refuse once converted).
Negative, fractional or unparsable values are errors, not drops: they mean the file is broken.

`iter_public` reads a file in time order a chunk at a time, with the same checks and drops and
the same times (rebased to the first kept request), for replays that stream.
"""
from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path
from typing import Iterator

import numpy as np

from traces.csvfile import CHUNK_ROWS, integers, iter_columns, read_columns, read_header, require_columns, seconds, \
    timestamps_ns
from traces.errors import NeedsSorting, TraceError
from traces.trace import LEFT_OUT_REASONS, MAX_ARRIVAL_S, Trace, first_out_of_order

MOONCAKE_BLOCK_TOKENS = 512  # each Mooncake hash id stands for one block of this many prompt tokens

_count = partial(integers, minimum=0)  # zeros are allowed here, then dropped and counted


def load_azure(path: str | Path) -> Trace:
    """Azure LLM inference trace, 2023 (Splitwise) or 2024 (DynamoLLM): columns `TIMESTAMP`
    (wall clock, e.g. `2023-11-16 18:15:46.6805900`, 100 ns resolution, a `+00:00` offset in the
    2024 files), `ContextTokens` (prompt) and `GeneratedTokens` (output). Sorted by time; times
    are differenced as integer nanoseconds, so the 7th fractional digit is kept."""
    path = Path(path)
    header = read_header(path)
    require_columns(path, header, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
    columns = read_columns(path, header, {"TIMESTAMP": timestamps_ns, "ContextTokens": _count,
                                          "GeneratedTokens": _count}, text_columns=("TIMESTAMP",))
    return _finish(path, columns["TIMESTAMP"], 1e9, columns["ContextTokens"],
                   columns["GeneratedTokens"], zero_output="dropped_zero_output")


def load_burstgpt(path: str | Path) -> Trace:
    """BurstGPT (GPT-3.5/GPT-4 behind Azure OpenAI): columns `Timestamp` (seconds from the first
    day's midnight), `Model`, `Request tokens`, `Response tokens`, `Total tokens`, `Log Type`.
    Failed requests (0 response tokens) are dropped and counted in `notes["dropped_failed"]`;
    the model and log type are not kept. Sorted by time."""
    path = Path(path)
    header = read_header(path)
    require_columns(path, header, ["Timestamp", "Request tokens", "Response tokens"])
    columns = read_columns(path, header, {"Timestamp": seconds, "Request tokens": _count,
                                          "Response tokens": _count})
    return _finish(path, columns["Timestamp"], 1.0, columns["Request tokens"],
                   columns["Response tokens"], zero_output="dropped_failed")


def load_mooncake(path: str | Path) -> Trace:
    """Mooncake JSONL, one request a line: `timestamp` (milliseconds), `input_length`,
    `output_length` and `hash_ids` (one id per 512-token prompt block, shared ids = shared
    prefixes), kept as `block_hashes`. Blank lines are skipped. Sorted by time."""
    path = Path(path)
    times, prompts, outputs, hashes, lines = [], [], [], [], []
    any_hashes = False
    for chunk in _mooncake_chunks(path, None):
        times.append(chunk["times"])
        prompts.append(chunk["prompts"])
        outputs.append(chunk["outputs"])
        hashes.extend(chunk["hashes"])
        lines.append(chunk["lines"])
        any_hashes = any_hashes or chunk["any_hashes"]
    return _finish(path, np.concatenate(times), 1e3, np.concatenate(prompts), np.concatenate(outputs),
                   zero_output="dropped_zero_output", block_hashes=hashes if any_hashes else None,
                   lines=np.concatenate(lines))


def _mooncake_chunks(path: Path, chunk_rows: int | None) -> Iterator[dict]:
    """Mooncake rows, checked, `chunk_rows` at a time: times, prompts, outputs, hashes, lines."""
    chunk_rows = chunk_rows or CHUNK_ROWS
    rows = 0

    def chunk(times, prompts, outputs, hashes, lines, any_hashes) -> dict:
        return {"times": np.array(times, dtype=np.float64), "prompts": np.array(prompts, dtype=np.int64),
                "outputs": np.array(outputs, dtype=np.int64), "hashes": hashes,
                "lines": np.array(lines, dtype=np.int64), "any_hashes": any_hashes}

    times, prompts, outputs, hashes, lines = [], [], [], [], []
    any_hashes = False
    with open(path, encoding="utf-8", errors="replace") as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                raise TraceError(path, line, f"not valid JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise TraceError(path, line, "expected a JSON object per line")
            for key in ("timestamp", "input_length", "output_length"):
                if key not in record:
                    raise TraceError(path, line, f"missing {key!r}")
            times.append(_json_ms(path, line, record["timestamp"]))
            prompts.append(_json_count(path, line, "input_length", record["input_length"]))
            outputs.append(_json_count(path, line, "output_length", record["output_length"]))
            ids = record.get("hash_ids", [])
            if not isinstance(ids, list) or not all(_is_int(h) for h in ids):
                raise TraceError(path, line, f"hash_ids must be a list of whole numbers, got {ids!r}")
            any_hashes = any_hashes or "hash_ids" in record
            hashes.append(ids)
            lines.append(line)
            if len(times) == chunk_rows:
                rows += len(times)
                yield chunk(times, prompts, outputs, hashes, lines, any_hashes)
                times, prompts, outputs, hashes, lines = [], [], [], [], []
    if not rows and not times:
        raise TraceError(path, 1, "the file is empty (expected one JSON request per line)")
    if times:
        yield chunk(times, prompts, outputs, hashes, lines, any_hashes)


def iter_public(path: Path, fmt: str, chunk_rows: int | None = None,
                left_out: dict[str, np.ndarray] | None = None) -> Iterator[Trace]:
    """A public-format file in time order as Traces of at most `chunk_rows` requests: the
    converter's checks and drops, times rebased to the first kept request. A row earlier than
    the one before it raises NeedsSorting (a whole load sorts it). `left_out`, if given, is
    filled as the file is read with the lines of the rows dropped, by reason (`Trace.left_out`)."""
    if fmt == "mooncake":
        raw, per_second = _mooncake_chunks(path, chunk_rows), 1e3
    else:
        names = {"azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
                 "burstgpt": ("Timestamp", "Request tokens", "Response tokens")}[fmt]
        header = read_header(path)
        require_columns(path, header, list(names))
        parse_time = timestamps_ns if fmt == "azure" else seconds
        per_second = 1e9 if fmt == "azure" else 1.0
        raw = ({"times": c[names[0]], "prompts": c[names[1]], "outputs": c[names[2]], "hashes": None,
                "lines": np.arange(c["line"], c["line"] + len(c[names[0]])), "any_hashes": False}
               for c in iter_columns(path, header, {names[0]: parse_time, names[1]: _count, names[2]: _count},
                                     text_columns=(names[0],) if fmt == "azure" else (), chunk_rows=chunk_rows))
    zero_output = "dropped_failed" if fmt == "burstgpt" else "dropped_zero_output"
    return _rebased_chunks(path, raw, per_second, zero_output, {} if left_out is None else left_out)


def _rebased_chunks(path: Path, raw: Iterator[dict], per_second: float, zero_output: str,
                    left_out: dict[str, np.ndarray]) -> Iterator[Trace]:
    first = None  # the first kept request's time
    last = None  # the previous row's time and line
    for c in raw:
        times = c["times"]
        if last is not None and times[0] < last[0]:
            _out_of_order(path, int(c["lines"][0]), last[1])
        i = first_out_of_order(times)
        if i is not None:
            _out_of_order(path, int(c["lines"][i]), int(c["lines"][i - 1]))
        last = (times[-1], int(c["lines"][-1]))
        keep, dropped = _keep(c["prompts"], c["outputs"], c["lines"], zero_output)
        for reason, lines in dropped.items():
            left_out[reason] = np.concatenate([left_out.get(reason, np.empty(0, np.int64)), lines])
        if not keep.size:
            continue
        if first is None:
            first = times[keep[0]]
        hashes = c["hashes"] if c["any_hashes"] else None
        arrival_s = (times[keep] - first).astype(np.float64) / per_second
        _check_span(path, arrival_s, c["lines"][keep])
        yield Trace(arrival_s=arrival_s,
                    prompt_tokens=c["prompts"][keep], output_tokens=c["outputs"][keep],
                    block_hashes=None if hashes is None else [hashes[i] for i in keep], name=path.stem)
    if first is None:
        raise TraceError(path, 2, "no requests left after dropping those with zero tokens")


def _out_of_order(path: Path, line: int, before: int) -> None:
    raise NeedsSorting(path, line, f"earlier than the request on line {before}: this file is not in time order, "
                                   "so it cannot be read a chunk at a time (load it whole, which sorts it, or "
                                   "convert it once with `python -m traces convert`)")


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _json_ms(path: Path, line: int, value: object) -> float:
    if _is_int(value) or (isinstance(value, float) and math.isfinite(value)):
        if value >= 0:
            return float(value)
    raise TraceError(path, line, f"timestamp must be a non-negative number of milliseconds, got {value!r}")


def _json_count(path: Path, line: int, key: str, value: object) -> int:
    if not _is_int(value):
        raise TraceError(path, line, f"{key} must be a whole number, got {value!r}")
    if value < 0:
        raise TraceError(path, line, f"{key} is negative, got {value}")
    if value > np.iinfo(np.int64).max:
        raise TraceError(path, line, f"{key} is past int64, got {value}")
    return value


def _keep(prompts: np.ndarray, outputs: np.ndarray, lines: np.ndarray,
          zero_output: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The rows to keep, and the lines of those dropped by reason: zero output tokens (under
    `zero_output`'s reason), else zero prompt tokens."""
    zero_out = outputs == 0
    zero_prompt = (prompts == 0) & ~zero_out
    dropped = {LEFT_OUT_REASONS[key]: lines[mask] for key, mask in ((zero_output, zero_out),
                                                                     ("dropped_zero_prompt", zero_prompt))}
    return np.flatnonzero(~zero_out & ~zero_prompt), {k: v for k, v in dropped.items() if v.size}


def _check_span(path: Path, arrival_s: np.ndarray, lines: np.ndarray) -> None:
    """Refuse a request later than MAX_ARRIVAL_S after the first, as the project loader does."""
    late = np.flatnonzero(arrival_s > MAX_ARRIVAL_S)
    if late.size:
        raise TraceError(path, int(lines[late[0]]), f"this request arrives {arrival_s[late[0]]:.6g} s after the "
                                                    f"first, past {MAX_ARRIVAL_S:g} s (about 3.2 years), the "
                                                    "longest trace this project replays")


def _finish(path: Path, times: np.ndarray, per_second: float, prompts: np.ndarray,
            outputs: np.ndarray, zero_output: str,
            block_hashes: list[list[int]] | None = None, lines: np.ndarray | None = None) -> Trace:
    """Drop zero-token requests (counted, their lines kept in `left_out`), sort by time, and
    rebase to the first request. `lines`: each row's line (default: a CSV's, 2, 3, ...)."""
    lines = np.arange(2, 2 + len(times), dtype=np.int64) if lines is None else lines
    keep, left_out = _keep(prompts, outputs, lines, zero_output)
    if keep.size == 0:
        raise TraceError(path, 2, "no requests left after dropping those with zero tokens")
    notes = {zero_output: int(np.sum(outputs == 0)), "dropped_zero_prompt": int(np.sum((prompts == 0) & (outputs != 0))),
             "out_of_order": int(np.sum(np.diff(times) < 0))}
    keep = keep[np.argsort(times[keep], kind="stable")]
    kept_times = times[keep]
    arrival_s = (kept_times - kept_times[0]).astype(np.float64) / per_second
    _check_span(path, arrival_s, lines[keep])
    return Trace(arrival_s=arrival_s, prompt_tokens=prompts[keep], output_tokens=outputs[keep],
                 block_hashes=None if block_hashes is None else [block_hashes[i] for i in keep],
                 name=path.stem, notes=notes, left_out=left_out)
