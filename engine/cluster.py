"""Several continuous-engine replicas, one process and one GPU each, behind the shared router.

The main process replays the trace in real time: when a request's arrival time comes, the
router (`core.routers`, the simulator's very code) picks a replica from what the replicas show
(requests sent and not yet finished; KV blocks in use and wanted, as each replica last
reported), and the request goes to that replica's inbox. Each replica runs `engine.continuous.
serve` on its own GPU with its own scheduler, writing its records as they happen; all share one
clock (perf_counter, which the processes of one machine share). When the trace is done the
replicas' records are merged into one run, each record naming its replica.
"""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import queue as queues
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from core.records import RequestRecord, read_pass_records, read_request_records, write_jsonl
from core.routers import make_router


@dataclass
class WorkerSpec:
    """What a replica process builds: the model, its cache and its scheduler."""

    model: str
    dtype: str
    seed: int
    device: str                # "cuda" or "cpu" (one GPU a process: CUDA_VISIBLE_DEVICES picks which)
    kernels: str
    graphs: bool
    overlap: bool
    policy: str
    scheduler: dict = field(default_factory=dict)   # make_scheduler's options
    kv_blocks: int | None = None
    kv_gib: float | None = None
    block_size: int = 16
    reserve_gib: float = 8.0
    report_kv: bool = False    # publish the KV load every pass (for the least-kv router)


class QueueArrivals:
    """Requests a replica is sent while it runs (a `serve` arrivals source); None ends them."""

    def __init__(self, inbox):
        self.inbox, self.pending, self.closed = inbox, [], False

    def _drain(self) -> None:
        while not self.closed:
            try:
                item = self.inbox.get_nowait()
            except queues.Empty:
                return
            if item is None:
                self.closed = True
            else:
                self.pending.append(item)

    def take(self, now: float) -> list:
        self._drain()
        out, self.pending = self.pending, []
        return out

    def next_arrival(self) -> float | None:
        self._drain()
        return float("inf") if self.closed and not self.pending else None

    def exhausted(self) -> bool:
        self._drain()
        return self.closed and not self.pending


def cpu_shares(cpus: list[int], replicas: int) -> tuple[list[int], list[list[int]]]:
    """The cores of this machine split between the router (the main process) and the replicas,
    disjoint, so that no replica's host loop waits for a core another process is using; when
    there are fewer than two cores a process, everyone shares them all."""
    if len(cpus) < 2 * replicas + 1:
        return cpus, [cpus] * replicas
    each = (len(cpus) - 1) // replicas
    return cpus[:1], [cpus[1 + i * each:1 + (i + 1) * each] for i in range(replicas)]


def _worker(index: int, spec: WorkerSpec, inbox, outbox, done_count, kv_load, run_dir: str, run_id: str,
            cpus: list[int] | None = None) -> None:
    """One replica: build the engine, say ready, wait for the start time, serve what comes."""
    try:
        import torch

        if cpus is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cpus)
        if spec.device == "cuda":  # the host only plans and launches: one thread, no spinning pool
            torch.set_num_threads(1)

        from core.kv import BlockPool
        from core.runstore import OpenRunWriter, RunStore
        from core.scheduler import make_scheduler
        from engine.continuous import ModelRunner, serve
        from engine.paged import PagedKVCache
        from engine.weights import load_model, parse_dtype

        dtype = parse_dtype(spec.dtype)
        device = torch.device(spec.device)
        model, _ = load_model(spec.model, dtype, device, seed=spec.seed)
        if spec.kv_blocks:
            blocks = spec.kv_blocks
        else:
            nbytes = (spec.kv_gib * 2**30 if spec.kv_gib else
                      torch.cuda.mem_get_info(device)[0] - spec.reserve_gib * 2**30 if device.type == "cuda" else 2**30)
            blocks = PagedKVCache.blocks_that_fit(model.config, nbytes, spec.block_size, dtype)
        cache = PagedKVCache(model.config, blocks, spec.block_size, dtype, device)
        scheduler = make_scheduler(spec.policy, BlockPool(blocks, spec.block_size), **spec.scheduler)
        runner = ModelRunner(model, cache, scheduler.max_num_seqs, spec.kernels, spec.graphs)
        runner.warm_up(scheduler.max_num_batched_tokens)
        writer = OpenRunWriter(RunStore(run_dir), f"replica{index}")
        outbox.put(("ready", index, blocks))
        message = inbox.get()
        start_at = message[1]

        def on_request(record: RequestRecord) -> None:
            writer.request(record)
            with done_count.get_lock():
                done_count.value += 1

        def on_pass(record) -> None:
            writer.pass_done(record)
            if spec.report_kv:  # only the least-kv router reads it: a walk over the waiting queue each pass
                kv = scheduler.kv
                queued = sum(kv.blocks_for(s.num_tokens) for _, s in scheduler.waiting)
                kv_load.value = (kv.used_blocks() + queued) / kv.num_blocks

        try:
            result = serve(QueueArrivals(inbox), scheduler, runner, run_id=run_id, overlap=spec.overlap,
                           on_request=on_request, on_pass=on_pass, replica=index, start_at=start_at,
                           while_waiting=writer.write_while)
        finally:  # the records kept so far are written, whatever ended the run
            writer.close()
        outbox.put(("finished", index, {"passes": len(result.passes), "interrupted": result.interrupted}))
    except BaseException:
        outbox.put(("error", index, traceback.format_exc()))


class ReplicaHandle:
    """What the router sees of a replica process."""

    def __init__(self, index: int, done_count, kv_load):
        self.index, self.sent, self._done, self._kv = index, 0, done_count, kv_load

    @property
    def num_outstanding(self) -> int:
        return self.sent - self._done.value

    @property
    def kv_load(self) -> float:
        return self._kv.value


def _from_each(outbox, replicas: int, failure: str) -> dict:
    """One message from every replica (its index -> payload); a replica's error is raised."""
    got = {}
    while len(got) < replicas:
        kind, i, payload = outbox.get()
        if kind == "error":
            raise RuntimeError(f"replica {i} {failure}:\n{payload}")
        got[i] = payload
    return got


def run_cluster(requests: list, spec: WorkerSpec, replicas: int, router: str, run_dir: Path, run_id: str,
                seed: int = 0, gpus: list[int] | None = None, progress=None) -> dict:
    """Serve `requests` (arrival order) on `replicas` replica processes behind `router`; the
    replicas' records end up merged in `run_dir` (requests.jsonl.gz, passes.jsonl.gz). Returns
    what happened: the requests each replica was sent, its passes, its KV blocks."""
    spec = dataclasses.replace(spec, report_kv=router == "least-kv")
    ctx = mp.get_context("spawn")
    outbox = ctx.Queue()
    inboxes = [ctx.Queue() for _ in range(replicas)]
    done = [ctx.Value("i", 0) for _ in range(replicas)]
    loads = [ctx.Value("d", 0.0, lock=False) for _ in range(replicas)]
    run_dir.mkdir(parents=True, exist_ok=True)
    processes = []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    pinned = spec.device == "cuda" and hasattr(os, "sched_getaffinity")
    if pinned:
        all_cpus = sorted(os.sched_getaffinity(0))
        router_cpus, replica_cpus = cpu_shares(all_cpus, replicas)
    else:
        router_cpus, replica_cpus = None, [None] * replicas
    try:
        for i in range(replicas):
            if spec.device == "cuda":  # one GPU a replica, seen as cuda:0 inside it
                os.environ["CUDA_VISIBLE_DEVICES"] = str((gpus or list(range(replicas)))[i])
            p = ctx.Process(target=_worker, args=(i, spec, inboxes[i], outbox, done[i], loads[i], str(run_dir), run_id,
                                                  replica_cpus[i]), daemon=True)
            p.start()
            processes.append(p)
    finally:
        if visible is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
    blocks = _from_each(outbox, replicas, "failed to start")
    if pinned:
        os.sched_setaffinity(0, router_cpus)
    handles = [ReplicaHandle(i, done[i], loads[i]) for i in range(replicas)]
    pick = make_router(router, seed)
    start_at = time.perf_counter() + 0.2
    for box in inboxes:
        box.put(("start", start_at))
    interrupted = False
    try:
        for n, req in enumerate(requests):
            wait = start_at + req.arrival_s - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            target = pick.pick(handles, req)
            target.sent += 1
            inboxes[target.index].put(req)
            if progress is not None:
                progress(n + 1, len(requests), handles)
    except KeyboardInterrupt:
        interrupted = True
    for box in inboxes:
        box.put(None)
    finished = _from_each(outbox, replicas, "failed")
    if pinned:
        os.sched_setaffinity(0, all_cpus)
    for p in processes:
        p.join(timeout=30)
    merge_replicas(run_dir, replicas)
    return {"requests_per_replica": [h.sent for h in handles], "kv_blocks_per_replica": [blocks[i] for i in range(replicas)],
            "passes_per_replica": [finished[i]["passes"] for i in range(replicas)],
            "interrupted": interrupted or any(finished[i]["interrupted"] for i in range(replicas))}


def merge_replicas(run_dir: Path, replicas: int) -> None:
    """The replicas' records as one run's: requests.jsonl.gz and passes.jsonl.gz in `run_dir`
    (passes in time order), the replicas' own directories then removed."""
    requests, passes = [], []
    for i in range(replicas):
        d = run_dir / f"replica{i}"
        requests += read_request_records(d / "requests.jsonl.gz")
        passes += read_pass_records(d / "passes.jsonl.gz")
    passes.sort(key=lambda p: (p.start_s, p.replica))
    write_jsonl(requests, run_dir / "requests.jsonl.gz")
    write_jsonl(passes, run_dir / "passes.jsonl.gz")
    for i in range(replicas):
        shutil.rmtree(run_dir / f"replica{i}")
