"""The continuous-batching engine: the simulator's scheduler deciding every pass on the GPU.

Requests join as they arrive; before every pass `core.scheduler` (the code the simulator runs)
plans which sequences go in and how many tokens each; `ModelRunner` turns the plan into one
forward pass over the flattened token batch, each sequence's cache in the KV blocks its block
table names; `on_pass_done` applies the pass. Every pass becomes a PassRecord (its shape, real
and padded batch, mode, host time, GPU start and duration) and every request a RequestRecord, the
records the simulator writes.

Overlap (on by default, vLLM V1's async scheduling, SGLang's overlap scheduler): the next pass is
planned and launched while the GPU runs the current one, so the host's scheduling time does not
idle the GPU. The scheduler's state is advanced as soon as a pass is launched (every sequence
that will sample is counted one token longer); the token itself reaches the host one pass later,
and a sequence's next input token is taken on the GPU from the pass that sampled it. A plan is
therefore made while the pass before it runs: a request arriving during pass i joins pass i + 2
at the earliest. `sim` models the same with `--overlap`. Without overlap every pass is planned
after the previous one ended and its tokens were read (and a sequence can stop at EOS).

Token times: the scheduler stamps tokens with the pass's index; when a pass's end time is read
off the GPU, the records of the requests that finished in it are written with real times.
"""
from __future__ import annotations

import gc
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from core.records import PassRecord, RequestRecord, pass_kind
from core.scheduler import ScheduledPass, Scheduler, Sequence
from engine.buckets import graph_buckets  # noqa: F401 (the buckets' rule, read by the sweep)
from engine.host_buffers import Downloads, EventPool, Uploads
from engine.kernels import choose_kernels
from engine.model import Qwen2
from engine.paged import Batch, PagedKVCache, forward_eager


@dataclass
class HostBatch:
    """A plan turned into arrays on the host: the rows of every sequence, decodes first."""

    order: list[int]            # plan index of each batch sequence
    tokens: np.ndarray          # [N] (0 where the token is still on the GPU)
    positions: np.ndarray
    slots: np.ndarray
    block_tables: np.ndarray    # [S, max blocks of this pass]
    context_lens: np.ndarray
    seq_lens: np.ndarray
    query_start: np.ndarray
    sample_rows: np.ndarray
    from_previous: tuple[np.ndarray, np.ndarray]  # (rows here, rows of the previous pass's samples)
    num_decode: int
    max_query_len: int
    samples: dict[int, int] = field(default_factory=dict)  # id(seq) -> its row in this pass's samples

    @property
    def num_seqs(self) -> int:
        return len(self.order)


def build_host_batch(plan: ScheduledPass, block_size: int, previous: dict[int, int] | None) -> HostBatch:
    """The arrays of one pass. A sequence whose last token was sampled by the previous pass and
    has not reached the host yet takes it from that pass's samples (`previous`: id -> row)."""
    seqs, new, ctx = plan.seqs, plan.new_tokens, plan.context_lens
    order = [r for r in range(len(seqs)) if new[r] == 1] + [r for r in range(len(seqs)) if new[r] != 1]
    n_rows = sum(new)
    tokens = np.zeros(n_rows, np.int64)
    positions = np.empty(n_rows, np.int64)
    slots = np.empty(n_rows, np.int64)
    widest = max(len(seqs[r].block_table) for r in order)
    tables = np.zeros((len(order), widest), np.int32)
    context_lens = np.empty(len(order), np.int32)
    query_start = np.empty(len(order) + 1, np.int32)
    sample_rows = np.empty(len(order), np.int64)
    gather_rows, gather_src, samples = [], [], {}
    row = 0
    for s, r in enumerate(order):
        seq, n, c = seqs[r], new[r], ctx[r]
        table = seq.block_table
        tables[s, :len(table)] = table
        context_lens[s], query_start[s] = c, row
        have = len(seq.token_ids)
        if n == 1:
            positions[row] = c
            slots[row] = table[c // block_size] * block_size + c % block_size
            if c < have:
                tokens[row] = seq.token_ids[c]
        else:
            p = np.arange(c, c + n)
            positions[row:row + n] = p
            slots[row:row + n] = tables[s, p // block_size].astype(np.int64) * block_size + p % block_size
            known = min(c + n, have) - c
            tokens[row:row + known] = seq.token_ids[c:c + known]
        if c + n > have:  # the last token is the one the previous pass sampled, still on the GPU
            if c + n != have + 1 or previous is None or id(seq) not in previous:
                raise RuntimeError(f"{seq}: token {have} is neither on the host nor in the previous pass")
            gather_rows.append(row + n - 1)
            gather_src.append(previous[id(seq)])
        row += n
        sample_rows[s] = row - 1
        if c + n == seq.num_tokens:  # this pass brings it up to date: it samples its next token
            samples[id(seq)] = s
    query_start[-1] = row
    seq_lens = context_lens + np.asarray([new[r] for r in order], np.int32)
    num_decode = sum(1 for r in order if new[r] == 1)
    return HostBatch(order, tokens, positions, slots, tables, context_lens, seq_lens, query_start, sample_rows,
                     (np.asarray(gather_rows, np.int64), np.asarray(gather_src, np.int64)), num_decode,
                     max(new), samples)


@dataclass
class Launched:
    """A pass on its way through the GPU."""

    index: int
    plan: ScheduledPass
    host: HostBatch
    sampled: torch.Tensor        # [S] on the device, batch order
    mode: str
    padded_to: int
    host_s: float                # host time spent planning and launching it
    marks: tuple                 # (start, end) clock marks
    finished: list[Sequence] = field(default_factory=list)
    sampled_host: torch.Tensor | None = None   # a pinned buffer the sampled tokens are copied into
    copied: object = None                      # the event that says the copy is done
    launch_s: float = 0.0                        # host time inside `launch`


class ModelRunner:
    """Executes plans: one forward pass per plan over the flattened batch, on `kernels`
    "triton" (the fused Triton kernels; decode passes replayed as CUDA graphs at padded batch
    buckets on a GPU) or "eager" (plain PyTorch, `engine.paged.forward_eager`)."""

    def __init__(self, model: Qwen2, cache: PagedKVCache, max_num_seqs: int, kernels: str = "triton",
                 graphs: bool = False, b1_tiles: dict | None = None, static_decode: bool = False,
                 small_tiles: dict | None = None, small_max: int | None = None):
        self.model, self.cache = model, cache
        self.device = model.embed_tokens.weight.device
        self.cuda = self.device.type == "cuda"
        if kernels not in ("triton", "eager"):
            raise ValueError(f"--kernels: unknown kernels {kernels!r}; choose triton or eager")
        chosen = choose_kernels(kernels)
        graphs = graphs and chosen == kernels  # no triton: no CUDA graphs either
        kernels = chosen
        if graphs and (not self.cuda or kernels != "triton"):
            raise ValueError("CUDA graphs need a CUDA device and the triton kernels")
        self.kernels, self.graphs = kernels, graphs
        self.max_num_seqs = max_num_seqs
        self.fast = None
        if kernels == "triton":
            from engine.paged_fast import PagedFastPath  # imports triton
            self.fast = PagedFastPath(model, cache, max_num_seqs, graphs, b1_tiles, static_decode, small_tiles,
                                      small_max)
        self.buckets = self.fast.buckets if graphs else []
        self.clock = PassClock(self.device)
        self.uploads = Uploads(self.device, torch.int32)
        self.downloads = Downloads(max_num_seqs) if self.cuda else None
        self.swapped: dict[int, torch.Tensor] = {}  # id(seq) -> its swapped-out blocks, on the host

    @property
    def mode_name(self) -> str:
        """How decode passes run: "graph", "triton" or "eager"."""
        return "graph" if self.graphs else self.kernels

    def to_device(self, host: HostBatch) -> Batch:
        """The batch's index arrays on the device: packed into one int32 array, copied in one go."""
        parts = [host.tokens, host.positions, host.slots, host.block_tables.ravel(), host.context_lens,
                 host.seq_lens, host.query_start, host.sample_rows]
        tokens, positions, slots, tables, context_lens, seq_lens, query_start, sample_rows = self.uploads.upload(parts)
        return Batch(tokens=tokens, positions=positions, slots=slots,
                     block_tables=tables.view(host.block_tables.shape), context_lens=context_lens, seq_lens=seq_lens,
                     query_start=query_start, sample_rows=sample_rows, num_decode=host.num_decode,
                     max_query_len=host.max_query_len)

    def launch(self, index: int, plan: ScheduledPass, host: HostBatch, previous: Launched | None,
               host_s: float) -> Launched:
        """Start the pass on the device (asynchronously on a GPU); copies of swapped caches first."""
        entered = time.perf_counter()
        start = self.clock.mark()
        self.swap(plan)
        rows, src = host.from_previous
        if self.fast is not None and self.fast.can_replay(host):
            sampled, mode, padded = self.fast.replay_decode(host, previous.sampled if len(rows) else None)
        elif self.fast is not None and self.fast.can_replay_prefill(host):
            sampled, mode, padded = self.fast.replay_prefill(host, previous.sampled if len(rows) else None)
        else:
            batch = self.to_device(host)
            if len(rows):
                where, = self.uploads.upload([np.concatenate([rows, src])])
                where = where.long()
                batch.tokens[where[:len(rows)]] = previous.sampled[where[len(rows):]].to(batch.tokens.dtype)
            if self.fast is not None:
                sampled, mode = self.fast.forward(batch), "triton"
            else:
                sampled, mode = forward_eager(self.model, self.cache, batch), "eager"
            padded = 0
        end = self.clock.mark()
        if not self.cuda:  # a graph path's output buffer is the next pass's too: keep this pass's tokens
            sampled = sampled.clone()
        launched = Launched(index, plan, host, sampled, mode, padded, host_s, (start, end))
        if self.cuda:  # in stream order, before the next pass can overwrite a graph's output
            launched.sampled_host, launched.copied = self.downloads.start(sampled)
        launched.launch_s = time.perf_counter() - entered
        return launched

    def warm_up(self, max_tokens: int) -> int:
        """Run a few passes of more tokens than the largest prefill graph before serving, so that
        the kernels such passes launch one by one are compiled now, not mid-run (a compile
        stalls a pass by up to a second; those kernels compile one variant whatever the batch,
        `engine.kernels.one_variant`). Returns the passes run (none without graphs)."""
        if not (self.graphs and self.fast is not None and self.fast.prefill_graphs):
            return 0
        low = self.fast.token_buckets[-1] + 1
        size = self.cache.block_size
        count = 0
        self.clock.zero()  # serving zeroes it again
        for tokens in (low, low + 15):  # one not a multiple of 16, one that is
            if tokens > max_tokens or -(-(tokens + 16 * 5) // size) + 5 > self.cache.num_blocks:
                continue
            for seqs in (1, 2, 5):
                for context in (0, 16):
                    new = [tokens // seqs] * (seqs - 1) + [tokens - tokens // seqs * (seqs - 1)]
                    plan, block = [], 0
                    for i, n in enumerate(new):
                        seq = Sequence(f"warm-up{i}", 0.0, context + n, 1, token_ids=[0] * (context + n))
                        seq.block_table = list(range(block, block + -(-(context + n) // size)))
                        block += len(seq.block_table)
                        seq.num_computed = context
                        plan.append(seq)
                    scheduled = ScheduledPass(plan, new, [context] * seqs)
                    self.collect(self.launch(count, scheduled, build_host_batch(scheduled, size, None), None, 0.0))
                    count += 1
        return count

    def swap(self, plan: ScheduledPass) -> None:
        """Copy preempted sequences' blocks to host memory, and restored ones back, before the
        pass (in stream order, so the pass's own writes into reused blocks come after)."""
        storage = self.cache.storage
        for seq, blocks in plan.swap_out:
            ids = torch.tensor(blocks, device=self.device)
            saved = torch.empty((storage.shape[0], 2, len(blocks), *storage.shape[3:]), dtype=storage.dtype,
                                pin_memory=self.cuda)
            saved.copy_(storage[:, :, ids], non_blocking=True)
            self.swapped[id(seq)] = saved
        for seq, blocks in plan.swap_in:
            saved = self.swapped.pop(id(seq))
            ids = torch.tensor(blocks[:saved.shape[2]], device=self.device)
            storage[:, :, ids] = saved.to(self.device, non_blocking=True)

    def running(self, launched: Launched) -> bool:
        """Whether the GPU is still running the pass (never on a CPU: a pass there is done when
        its launch returns)."""
        return self.cuda and not launched.marks[1].query()

    def collect(self, launched: Launched) -> tuple[list[int], float, float]:
        """Wait for a pass; its sampled tokens (batch order) and its start and end, in seconds
        since the clock's start."""
        start, end = self.clock.seconds(*launched.marks)
        self.clock.release(*launched.marks)
        if launched.sampled_host is None:
            return launched.sampled.tolist(), start, end
        launched.copied.synchronize()
        tokens = launched.sampled_host[:launched.sampled.numel()].tolist()
        self.downloads.give_back(launched.sampled_host, launched.copied)
        launched.sampled_host = None
        return tokens, start, end


class PassClock:
    """When passes start and end: CUDA events on a GPU (read once a pass is done, so the host
    never waits for the GPU to stamp one), the host clock on a CPU. Seconds since `zero()`."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.t0 = time.perf_counter()
        self.origin = None
        self.offset = 0.0  # seconds from the run's 0 to the GPU origin event
        self.events = EventPool(enable_timing=True) if self.cuda else None

    def zero(self, at: float | None = None) -> None:
        """Start the run's clock: time 0 is this moment, or the host time `at` (perf_counter,
        which processes of one machine share: replicas agree on one 0)."""
        if self.cuda:
            torch.cuda.synchronize()
            self.origin = torch.cuda.Event(enable_timing=True)
            self.origin.record()
            self.origin.synchronize()
        now = time.perf_counter()
        self.t0 = now if at is None else at
        self.offset = now - self.t0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def sleep(self, seconds: float) -> None:
        """Wait `seconds` on this clock (the host's: a test's clock may advance without waiting)."""
        time.sleep(seconds)

    def mark(self):
        return self.events.record() if self.cuda else self.now()

    def release(self, *marks) -> None:
        """Marks whose times have been read, for reuse."""
        if self.cuda:
            self.events.release(*marks)

    def seconds(self, start, end) -> tuple[float, float]:
        if self.cuda:
            end.synchronize()
            return (self.offset + self.origin.elapsed_time(start) / 1e3,
                    self.offset + self.origin.elapsed_time(end) / 1e3)
        return start, end


@dataclass
class Request:
    """A request to replay: when it arrives (seconds from the run's start) and its prompt."""

    request_id: str
    arrival_s: float
    prompt: list[int]
    max_output_tokens: int


class ListArrivals:
    """Requests known in advance, joining at their arrival times (all at once if not `realtime`)."""

    def __init__(self, requests: list[Request], realtime: bool = True):
        self.queue, self.realtime, self.total = deque(requests), realtime, len(requests)

    def take(self, now: float) -> list[Request]:
        out = []
        while self.queue and (not self.realtime or self.queue[0].arrival_s <= now):
            out.append(self.queue.popleft())
        return out

    def next_arrival(self) -> float | None:
        """When the next request arrives (None: none known); inf when none will."""
        return self.queue[0].arrival_s if self.queue else float("inf")

    def exhausted(self) -> bool:
        return not self.queue


@dataclass
class ServeResult:
    requests: list[RequestRecord]
    passes: list[PassRecord]
    interrupted: bool
    wall_s: float
    tokens: dict[str, list[int]]  # request id -> generated token ids


def serve(requests, scheduler: Scheduler, runner: ModelRunner, *, run_id: str = "continuous",
          overlap: bool = True, realtime: bool = True, on_request: Callable[[RequestRecord], None] | None = None,
          on_pass: Callable[[PassRecord], None] | None = None,
          progress: Callable[[Scheduler, int, int], None] | None = None, replica: int = 0,
          start_at: float | None = None,
          while_waiting: Callable[[Callable[[], bool]], None] | None = None) -> ServeResult:
    """Replay `requests` (a list in arrival order, or an arrivals source like `ListArrivals`) on
    the engine: each joins the scheduler when its arrival time comes (all at once when not
    `realtime`), passes run until every request has finished or been rejected. `on_request` /
    `on_pass` receive each record as it is final (to write it at once); a Ctrl-C ends the run
    early with what finished kept (`interrupted`). `replica` names this engine in its records;
    `start_at` is the shared perf_counter time of the run's 0 (several replicas).
    `while_waiting(busy)` is called when the host would wait anyway (for the GPU to finish the
    oldest pass, or for the next arrival), to do work such as writing records for as long as
    `busy()` stays true."""
    if overlap and scheduler.eos_token_id is not None:
        raise ValueError("overlap plans the next pass before the tokens of this one are read, so a sequence "
                         "cannot stop at EOS; run without overlap to stop at EOS")
    depth = 2 if overlap else 1
    clock = runner.clock
    arrivals = ListArrivals(requests, realtime) if isinstance(requests, list) else requests
    total = getattr(arrivals, "total", 0)
    seqs: dict[int, Sequence] = {}
    records: list[RequestRecord] = []
    passes: list[PassRecord] = []
    tokens: dict[str, list[int]] = {}
    end_of_pass: list[float] = []
    inflight: deque[Launched] = deque()
    finished_count = 0
    index = 0
    wall = time.perf_counter()

    def finish(record: RequestRecord) -> None:
        records.append(record)
        if on_request is not None:
            on_request(record)

    def admit(now: float) -> None:
        for req in arrivals.take(now):
            i = len(seqs)
            seq = Sequence(req.request_id, req.arrival_s if realtime else 0.0, len(req.prompt),
                           req.max_output_tokens, keep_token_times=True, index=i, token_ids=req.prompt)
            seq.replica = replica
            seqs[i] = seq
            if scheduler.add(seq, now) is not None:
                finish(seq.record(run_id))

    def retire(done: Launched) -> None:
        nonlocal finished_count
        sampled, start, end = runner.collect(done)
        end_of_pass.append(end)
        done.plan.started(start)
        host = done.host
        if overlap:
            for s, r in enumerate(host.order):
                seq = done.plan.seqs[r]
                if id(seq) in host.samples:
                    seq.token_ids.append(sampled[s])
            left = done.finished
        else:
            in_plan_order = [0] * len(host.order)
            for s, r in enumerate(host.order):
                in_plan_order[r] = sampled[s]
            left = scheduler.on_pass_done(done.plan, float(done.index), in_plan_order)
        plan = done.plan
        record = PassRecord(run_id=run_id, engine="continuous", step=done.index,
                            kind=pass_kind(plan.new_tokens, plan.context_lens), new_tokens=list(plan.new_tokens),
                            context_lens=list(plan.context_lens), start_s=start, duration_s=end - start,
                            mode=done.mode, padded_to=done.padded_to, host_s=done.host_s, launch_s=done.launch_s,
                            replica=replica)
        passes.append(record)
        if on_pass is not None:
            on_pass(record)
        for seq in left:
            tokens[seq.request_id] = seq.token_ids[seq.prompt_tokens:]
            finish(timed_record(seq, end_of_pass, run_id))
            finished_count += 1

    clock.zero(start_at)
    # No cyclic garbage collection while serving: a full collection walks every object alive
    # (each request's token ids among them) and paused launches for up to a second in the
    # two-replica Azure runs; what cycles a run leaves are collected when it ends.
    collecting = gc.isenabled()
    gc.disable()
    try:
        while True:
            t = time.perf_counter()
            now = clock.now()
            admit(now)
            plan = scheduler.schedule(now) if len(inflight) < depth else None
            if plan is not None:
                previous = inflight[-1].host.samples if inflight else None
                host = build_host_batch(plan, runner.cache.block_size, previous)
                launched = runner.launch(index, plan, host, inflight[-1] if inflight else None,
                                         time.perf_counter() - t)
                if overlap:  # the scheduler moves on now; the tokens follow when the pass is read
                    launched.finished = scheduler.on_pass_done(plan, float(index))
                inflight.append(launched)
                index += 1
                if len(inflight) < depth:
                    continue
            if inflight:
                if while_waiting is not None and runner.running(inflight[0]):
                    while_waiting(lambda: runner.running(inflight[0]))
                retire(inflight.popleft())
                if progress is not None:
                    progress(scheduler, finished_count, total)
                continue
            if arrivals.exhausted() and not scheduler.num_outstanding:
                break
            wait_until = arrivals.next_arrival()
            if wait_until is None:  # arrivals nobody has announced yet: look again shortly
                wait_until = clock.now() + 0.0002
            if scheduler.next_wakeup is not None:
                wait_until = min(wait_until, scheduler.next_wakeup)
            if wait_until == float("inf"):
                raise RuntimeError(f"{scheduler.num_outstanding} requests wait but nothing can run; the "
                                   f"scheduler is stuck")
            if while_waiting is not None and wait_until - clock.now() > 0.002:
                while_waiting(lambda: wait_until - clock.now() > 0.002)
            pause = wait_until - clock.now()
            if pause > 0:
                clock.sleep(min(pause, 0.0005) if pause < 0.002 else pause - 0.001)
        interrupted = False
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if collecting:
            gc.enable()
    return ServeResult(records, passes, interrupted, time.perf_counter() - wall, tokens)


def timed_record(seq: Sequence, end_of_pass: list[float], run_id: str) -> RequestRecord:
    """A finished sequence's record, its tokens stamped with pass indices turned into the ends
    of those passes, in seconds."""
    record = seq.record(run_id)
    record.set_token_times([end_of_pass[int(i)] for i in seq.token_times])
    record.max_output_tokens = seq.max_output_tokens
    return record


@dataclass
class ClosedRun:
    """A closed run of the continuous engine (every prompt at t = 0), shaped as the closed-run
    harness reads the static engines' runs (`engine.engines.Generation`)."""

    records: list[RequestRecord]
    passes: list[PassRecord]
    prompt_lens: list[int]
    tokens: list[list[int]]

    @property
    def step_times_s(self) -> list[float]:
        return self.records[0].token_times_s

    def request_records(self, run_id: str = "") -> list[RequestRecord]:
        return self.records


def closed_run(runner: ModelRunner, prompts: list[list[int]], max_new_tokens: int, run_id: str = "",
               max_model_len: int | None = None, overlap: bool = True) -> ClosedRun:
    """Every prompt handed to the continuous engine at once, as the static engine's closed runs
    are: prefilled together in one pass (the token budget is set to hold them all), then decoded
    together, planned by the shared scheduler."""
    from core.kv import BlockPool
    from core.scheduler import ContinuousBatching

    cache = runner.cache
    max_model_len = max_model_len or max(map(len, prompts)) + max_new_tokens
    scheduler = ContinuousBatching(BlockPool(cache.num_blocks, cache.block_size), max_num_seqs=len(prompts),
                                   max_num_batched_tokens=max(sum(map(len, prompts)), max_model_len),
                                   max_model_len=max_model_len)
    requests = [Request(str(i), 0.0, list(p), max_new_tokens) for i, p in enumerate(prompts)]
    result = serve(requests, scheduler, runner, run_id=run_id, overlap=overlap, realtime=False)
    if result.interrupted:
        raise KeyboardInterrupt
    records = sorted(result.requests, key=lambda r: int(r.request_id))
    if any(not r.completed for r in records):
        bad = next(r for r in records if not r.completed)
        raise ValueError(f"request {bad.request_id} did not complete: {bad.rejected}")
    return ClosedRun(records, result.passes, [len(p) for p in prompts],
                     [result.tokens[r.request_id] for r in records])
