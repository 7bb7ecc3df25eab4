"""Where grid points run: worker processes on this machine (the default), or a mapper given to it.

A runner is a function `run(specs, slos)` that yields each spec's row (`run_point`: the axes'
values, the seed, the metrics) as it finishes, in any order. `runner(jobs)` keeps `jobs` worker
processes for its with-block; `runner(mapper=...)` sends each point, as a plain dict, to a
function's `.map`: modal_app.py's `sweep` and `capacity` entrypoints pass `simulate_point.map`,
which runs `point_row`, the same function on the same points. The sweep and the capacity search
take either; the simulator never imports Modal or modal_app.py.

A Modal container has the code but not this machine's files, so the trace travels with each
point and the cost model must be a preset or a committed calibration (`calibrated:NAME`), which
the image carries (`check_remote_cost`).
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Callable, Iterable, Iterator

from core.metrics import compute_metrics
from sim.build import AXES, RunSpec, load_trace_file, simulate_spec
from traces.trace import Trace

Runner = Callable[[list[RunSpec], "dict[str, float] | None"], Iterator[dict]]


def run_point(spec: RunSpec, slos: dict[str, float] | None = None, trace: Trace | None = None) -> dict:
    """One run's row: the axes' values, the seed, the metrics (vLLM names) and the run's cost
    (`trace` replaces the file spec.trace names, when given)."""
    result = simulate_spec(spec, trace)
    row = {name: getattr(spec, name) for name in AXES}
    row["seed"] = spec.seed
    row.update(compute_metrics(result.table, slos).as_row())
    row["passes"] = result.num_passes
    row["wall_s"] = result.wall_s
    return row


def point_row(spec: dict, slos: dict[str, float] | None = None, trace: Trace | None = None) -> dict:
    """`run_point` on a RunSpec given as a plain dict: the body of modal_app.simulate_point."""
    return run_point(RunSpec(**spec), slos, trace)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _start_worker(parent: int) -> None:
    """A worker's first step: Ctrl-C is left to the main process, and the worker ends when its
    parent does (killed, even by SIGKILL), instead of living on blocked on a pipe no one writes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    threading.Thread(target=_end_with, args=(parent,), daemon=True).start()  # elsewhere, and a parent gone already


def _end_with(parent: int, every_s: float = 1.0) -> None:
    while os.getppid() == parent:
        time.sleep(every_s)
    os._exit(1)


@contextlib.contextmanager
def local_runner(jobs: int | None = None) -> Iterator[Runner]:
    """A runner over at most `jobs` worker processes (default one per CPU), started at its first
    call, as many as that call has points, and kept for the with-block (one: in this process);
    Ctrl-C or an error stops the workers at once."""
    jobs = jobs or os.cpu_count() or 1
    pool: ProcessPoolExecutor | None = None
    inline = jobs == 1

    def run(specs: list[RunSpec], slos: dict[str, float] | None = None) -> Iterator[dict]:
        nonlocal pool, inline
        if pool is None and not inline:
            workers = min(jobs, len(specs))
            inline = workers <= 1
            if not inline:
                pool = ProcessPoolExecutor(max_workers=workers, initializer=_start_worker,
                                           initargs=(os.getpid(),))
        if inline:
            yield from (run_point(spec, slos) for spec in specs)
            return
        pending = {pool.submit(run_point, spec, slos) for spec in specs}
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                yield future.result()

    try:
        yield run
    except BaseException:
        if pool is not None:
            for process in list(getattr(pool, "_processes", {}).values()):
                process.terminate()
            pool.shutdown(wait=False, cancel_futures=True)
        raise
    if pool is not None:
        pool.shutdown()


def mapped_runner(mapper: Callable[..., Iterable[dict]]) -> Runner:
    """A runner that hands the points to `mapper(spec_dicts, kwargs={"slos": ..., "trace": ...})`,
    the signature of a Modal function's `.map`, one call per trace."""
    def run(specs: list[RunSpec], slos: dict[str, float] | None = None) -> Iterator[dict]:
        for spec in specs:
            check_remote_cost(spec.cost)
        by_trace: dict[tuple, list[RunSpec]] = {}
        for spec in specs:
            by_trace.setdefault((spec.trace, spec.trace_format), []).append(spec)
        for (path, fmt), group in by_trace.items():
            trace = load_trace_file(path, fmt)
            yield from mapper([dataclasses.asdict(s) for s in group], kwargs={"slos": slos, "trace": trace})
    return run


def check_remote_cost(cost: str) -> None:
    kind, sep, _ = cost.partition(":")
    if not (sep and kind in ("roofline", "constant", "calibrated")):
        raise ValueError(f"modal_app.py: --cost {cost!r} is a file on this machine, which Modal's containers do not "
                         f"have; commit it under results/calibration/ and name it calibrated:NAME")


@contextlib.contextmanager
def runner(jobs: int | None = None, mapper: Callable[..., Iterable[dict]] | None = None) -> Iterator[Runner]:
    """Local worker processes, or `mapped_runner(mapper)` when given one (modal_app.py's sweep and
    capacity entrypoints pass simulate_point.map)."""
    if mapper is None:
        with local_runner(jobs) as run:
            yield run
        return
    yield mapped_runner(mapper)
