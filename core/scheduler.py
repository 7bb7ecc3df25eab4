"""Scheduling policies: which sequences go into the next forward pass, and how many tokens each.

Pure Python (no simpy, no torch): the real engine (`engine.continuous`) and the simulator
(`sim.replica`) run this very code. Both drive a scheduler with the same calls; only where a
pass's duration comes from differs (measured on the GPU, or predicted by a cost model):

    scheduler = ContinuousBatching(BlockPool(num_blocks), max_model_len=32768)
    reason = scheduler.add(Sequence("r1", arrival_s, prompt_tokens, max_output_tokens))
    # reason is None, or why the request can never run (it is then rejected, and done)
    while True:
        plan = scheduler.schedule(now)        # a ScheduledPass, or None: nothing to run now
        if plan is None:                      # wait for an arrival, or until
            ...                               # scheduler.next_wakeup when that is not None
        # Before the pass: copy plan.swap_out's blocks to host memory, and host copies into
        # plan.swap_in's blocks. One forward pass: sequence plan.seqs[i] puts its tokens at
        # positions plan.context_lens[i] .. plan.context_lens[i] + plan.new_tokens[i] - 1
        # through the model, its cache in the blocks plan.seqs[i].block_table.
        finished = scheduler.on_pass_done(plan, now, sampled_token_ids)   # `now`: when it ended

A pass that brings a sequence's cache up to all its known tokens samples one new token: the
first output token when the prompt is done, then one per decode pass. `on_pass_done` records
its time, appends the sampled token to `seq.token_ids` when the sequence carries its tokens,
stops a sequence at `eos_token_id` when the scheduler was given one, and returns the sequences
that finished. `seq.record()` is then the run's RequestRecord. A preempted sequence loses its
cache (`preemption="recompute"`: it later puts its prompt and generated tokens through again)
or has it copied out and back in (`preemption="swap"`).

Policies:
- `StaticBatching`: wait for `batch_size` requests or `timeout_s`, run them to completion.
- `ContinuousBatching`: vLLM's scheduler before chunked prefill: admit waiting prompts whole,
  in a prefill-only pass, while KV blocks, `max_num_seqs` and `max_num_batched_tokens` allow;
  otherwise decode every running sequence, preempting the lowest-ranked when blocks run out.
- `ChunkedPrefill`: Sarathi-Serve's (and vLLM V1's) token budget per pass: decodes first, then
  continuing prompt chunks, then chunks of new prompts fill what is left.
- `DecodePriority`: continuous batching that holds new prompts back while sequences decode,
  as Hugging Face TGI does (`waiting_served_ratio`, `max_waiting_tokens`).

Waiting and running sequences are ranked by `order(seq)`, then arrival: first come first served
by default, `by_priority` for the trace's priority classes, `shortest_prompt_first`. The
lowest-ranked running sequence is the one preempted.
"""
from __future__ import annotations

from bisect import insort
from dataclasses import dataclass
from heapq import heappop, heappush
from itertools import repeat
from typing import Callable, Sequence as Seq

from core.kv import BlockPool, blocks_for
from core.records import RequestRecord

Order = Callable[["Sequence"], float]
PREEMPTION_MODES = ("recompute", "swap")


def by_priority(seq: "Sequence") -> int:
    """Priority classes: lower runs first (the trace's `priority` column)."""
    return seq.priority


def shortest_prompt_first(seq: "Sequence") -> int:
    return seq.prompt_tokens


def _rank(seq: "Sequence"):
    return seq.rank


class Sequence:
    """One request as a scheduler sees it: its tokens so far and how many are in the KV cache.

    token_ids: the prompt's token ids, when the caller has them (the engine does, the simulator
        does not); sampled tokens are appended to it, so a preempted sequence can be recomputed.
    """

    __slots__ = ("request_id", "arrival_s", "prompt_tokens", "max_output_tokens", "priority",
                 "block_hashes", "index", "rank", "num_tokens", "num_computed", "block_table",
                 "shared", "swapped", "first_token_s", "last_token_s", "finish_s", "token_times",
                 "preemptions", "rejected", "replica", "token_ids", "queued_s", "scheduled_s")

    def __init__(self, request_id: str, arrival_s: float, prompt_tokens: int, max_output_tokens: int,
                 priority: int = 0, block_hashes: list[int] | None = None,
                 keep_token_times: bool = False, index: int = 0, token_ids: list[int] | None = None):
        if token_ids is not None and len(token_ids) != prompt_tokens:
            raise ValueError(f"request {request_id!r}: {len(token_ids)} token ids for a prompt of "
                             f"{prompt_tokens} tokens")
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.max_output_tokens = max_output_tokens
        self.priority = priority
        self.block_hashes = block_hashes or ()
        self.index = index  # arrival order, the tie-break of every ranking
        self.rank = index
        self.num_tokens = prompt_tokens  # prompt + tokens generated so far
        self.num_computed = 0  # tokens whose K and V are in the cache
        self.block_table: list[int] = []
        self.shared = 0  # leading prompt hash blocks shared through a prefix cache
        self.swapped = False
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.finish_s: float | None = None
        self.token_times: list[float] | None = [] if keep_token_times else None
        self.preemptions = 0
        self.rejected: str | None = None
        self.replica = 0
        self.token_ids = None if token_ids is None else list(token_ids)
        self.queued_s: float | None = None  # when the scheduler took it in (`Scheduler.add`)
        self.scheduled_s: float | None = None  # when its first pass started (`ScheduledPass.started`)

    @property
    def generated(self) -> int:
        return self.num_tokens - self.prompt_tokens

    def record(self, run_id: str = "") -> RequestRecord:
        """This request's record, the same one the real engine writes."""
        out = self.num_tokens - self.prompt_tokens
        return RequestRecord(
            request_id=self.request_id, arrival_s=self.arrival_s, prompt_tokens=self.prompt_tokens,
            max_output_tokens=self.max_output_tokens, output_tokens=out, first_token_s=self.first_token_s,
            finish_s=self.finish_s, token_times_s=self.token_times if self.token_times is not None else [],
            itl_sum_s=self.last_token_s - self.first_token_s if out > 1 else 0.0,
            itl_count=out - 1 if out > 1 else 0, preemptions=self.preemptions, rejected=self.rejected,
            replica=self.replica, run_id=run_id, queued_s=self.queued_s, scheduled_s=self.scheduled_s)

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, prompt={self.prompt_tokens}, "
                f"out={self.generated}/{self.max_output_tokens}, cached={self.num_computed})")


@dataclass(slots=True)
class ScheduledPass:
    """The next forward pass: per sequence, how many new tokens on top of how much context.

    preempted: sequences taken out of the batch for this pass (their cache dropped or swapped).
    swap_out: (sequence, block ids) whose contents go to host memory before the pass;
    swap_in: (sequence, block ids) that host copies go into before the pass (the first
        `blocks_for(seq.num_computed)` of the ids listed hold its restored cache).
    decode: every sequence puts one token through on top of its cache and samples the next (a
        decode, or a prompt's last one-token chunk), and nobody joined the batch for this pass.
    """

    seqs: list[Sequence]
    new_tokens: list[int]
    context_lens: list[int]
    preempted: list[Sequence] | tuple = ()
    swap_out: list[tuple[Sequence, list[int]]] | tuple = ()
    swap_in: list[tuple[Sequence, list[int]]] | tuple = ()
    decode: bool = False

    def started(self, start_s: float) -> None:
        """The pass started on the device at `start_s`: the first pass of those of its
        sequences that had none (their `scheduled_s`); the engine and the simulator both call it."""
        if self.decode:  # everyone in it has run before
            return
        for seq in self.seqs:
            if seq.scheduled_s is None:
                seq.scheduled_s = start_s


class Scheduler:
    """What every policy shares: the waiting queue, the running batch, applying finished passes.

    kv: the block pool the scheduler allocates from.
    max_num_seqs: most sequences running at once.
    max_num_batched_tokens: most tokens in one pass (policies set their own default).
    max_model_len: longest prompt + output accepted; defaults to what the cache holds.
    order: rank of a sequence (lower first); None is first come first served.
    prefill_only: hand sequences off once their first token is out (disaggregated prefill); their
        cache stays allocated until `release`.
    preemption: "recompute" (a victim's cache is dropped) or "swap" (copied to host and back).
    eos_token_id: stop a sequence when it samples this token (None: run to max_output_tokens).
    """

    def __init__(self, kv: BlockPool, max_num_seqs: int = 256, max_num_batched_tokens: int | None = None,
                 max_model_len: int | None = None, order: Order | None = None, prefill_only: bool = False,
                 preemption: str = "recompute", eos_token_id: int | None = None):
        if max_model_len is None:
            max_model_len = kv.capacity_tokens
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be at least 2 (a prompt token and an output token), "
                             f"got {max_model_len}")
        if max_model_len > kv.capacity_tokens:
            raise ValueError(
                f"the KV cache holds {kv.capacity_tokens} tokens ({kv.num_blocks} blocks of {kv.block_size}), "
                f"fewer than one request of max_model_len={max_model_len}: give it more memory or lower "
                f"max_model_len")
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {max_num_seqs}")
        if max_num_batched_tokens is not None and max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be at least 1, got {max_num_batched_tokens}")
        if preemption not in PREEMPTION_MODES:
            raise ValueError(f"unknown preemption {preemption!r}; choose {' or '.join(PREEMPTION_MODES)}")
        if preemption == "swap" and kv.prefix_caching:
            raise ValueError("prefix caching with swap preemption is not modelled; use recompute")
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens or max(max_model_len, 2048)
        self.max_model_len = max_model_len
        self.order = order
        self.prefill_only = prefill_only
        self.swap = preemption == "swap"
        self.eos_token_id = eos_token_id
        self.waiting: list[tuple] = []  # heap of (rank, seq)
        self.running: list[Sequence] = []  # sorted by rank
        self.next_wakeup: float | None = None

    # ------------------------------------------------------------------ arrivals

    def check(self, seq: Sequence) -> str | None:
        """Why `seq` could never run here, or None."""
        if seq.prompt_tokens < 1 or seq.max_output_tokens < 1:
            return f"prompt ({seq.prompt_tokens}) and output ({seq.max_output_tokens}) tokens must be positive"
        total = seq.prompt_tokens + seq.max_output_tokens
        if total > self.max_model_len:
            return (f"prompt {seq.prompt_tokens} + output {seq.max_output_tokens} = {total} tokens "
                    f"exceeds max_model_len {self.max_model_len}")
        return None

    def add(self, seq: Sequence, now: float | None = None) -> str | None:
        """Queue an arriving sequence, taken in at `now` (its arrival when None; a sequence
        handed over from another replica keeps its first intake); return the rejection reason
        if it can never run."""
        if seq.queued_s is None:
            seq.queued_s = seq.arrival_s if now is None else now
        reason = self.check(seq)
        if reason is not None:
            seq.rejected = reason
            return reason
        seq.rank = seq.index if self.order is None else (self.order(seq), seq.index)
        heappush(self.waiting, (seq.rank, seq))
        return None

    @property
    def num_outstanding(self) -> int:
        """Requests here and not finished: waiting or running."""
        return len(self.waiting) + len(self.running)

    # ------------------------------------------------------------------ planning

    def schedule(self, now: float) -> ScheduledPass | None:
        raise NotImplementedError

    def _try_admit(self, seq: Sequence, budget: int, whole: bool) -> int:
        """Give `seq` the cache for its next tokens (all of them if `whole`, else up to `budget`);
        return how many it will compute, or 0 if they don't fit."""
        kv = self.kv
        start = seq.num_computed
        hit = kv.lookup(seq) if start == 0 and kv.prefix_caching else 0
        start = max(start, hit)
        n = seq.num_tokens - start
        if n > budget:
            if whole:
                return 0
            n = budget
        if n <= 0 or not kv.allocate(seq, start + n, hit):
            return 0
        seq.num_computed = start
        return n

    def _admit_waiting(self, budget: int, whole: bool, seqs: list, new: list, ctx: list) -> tuple[int, list]:
        """Start waiting prompts, in rank order, while they fit the token budget (whole prompts
        or chunks), the cache and max_num_seqs, adding each to the pass being built; return the
        budget left and the swap-ins."""
        swap_in = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0][1]
            n = self._try_admit(seq, budget, whole)
            if not n:
                break
            heappop(self.waiting)
            insort(self.running, seq, key=_rank)
            if seq.swapped:
                seq.swapped = False
                swap_in.append((seq, seq.block_table[:blocks_for(seq.num_computed, self.kv.block_size)]))
            seqs.append(seq)
            new.append(n)
            ctx.append(seq.num_computed)
            budget -= n
        return budget, swap_in

    def _preempt(self, seq: Sequence, swap_out: list) -> None:
        """Take `seq` out of the batch, its cache dropped or (noted in `swap_out`) swapped out."""
        seq.preemptions += 1
        if self.swap:
            swap_out.append((seq, list(seq.block_table)))
            seq.swapped = True
        else:
            seq.num_computed = 0
        self.kv.release(seq)
        heappush(self.waiting, (seq.rank, seq))

    def _grow_or_preempt(self, queue: list[Sequence], budget: int) -> tuple[list, list, list, list, int]:
        """Give each sequence of `queue` (in rank order) the blocks for its next tokens, as many
        as are left to compute, within `budget`; when blocks run out, preempt from the tail (the
        lowest-ranked not yet served: the sequence itself when it is the last). Returns the
        served sequences, their new tokens, the preempted, the swap-outs and the budget left."""
        allocate = self.kv.allocate
        seqs: list[Sequence] = []
        new: list[int] = []
        preempted: list[Sequence] = []
        swap_out: list = []
        i, end = 0, len(queue)
        while i < end:
            seq = queue[i]
            i += 1
            n = min(seq.num_tokens - seq.num_computed, budget)
            if n == 0:
                continue  # budget spent: it keeps its cache and its place
            while not allocate(seq, seq.num_computed + n):
                end -= 1
                victim = queue[end]
                self._preempt(victim, swap_out)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                seqs.append(seq)
                new.append(n)
                budget -= n
        if preempted:
            gone = set(map(id, preempted))
            self.running = [s for s in self.running if id(s) not in gone]
        return seqs, new, preempted, swap_out, budget

    def _decode_running(self) -> ScheduledPass | None:
        """One decode token for every running sequence, preempting as blocks run out."""
        allocate, queue, bs = self.kv.allocate, self.running, self.kv.block_size
        for seq in queue:  # the common case: everyone gets its block
            if seq.num_computed < len(seq.block_table) * bs:
                continue  # its last block has room for the token (allocate's first check, without the call)
            if not allocate(seq, seq.num_computed + 1):
                break
        else:
            if not queue:
                return None
            return ScheduledPass(list(queue), [1] * len(queue), [s.num_computed for s in queue], decode=True)
        # someone didn't: start over (allocating again is a no-op), preempting as needed
        seqs, new, preempted, swap_out, _ = self._grow_or_preempt(queue, len(queue))
        if not seqs:
            return None
        return ScheduledPass(seqs, new, [s.num_computed for s in seqs], preempted, swap_out, decode=True)

    # ------------------------------------------------------------------ finished passes

    def on_pass_done(self, plan: ScheduledPass, now: float,
                     sampled_token_ids: Seq[int] | None = None) -> list[Sequence]:
        """Apply a finished pass: caches grow, caught-up sequences get a token at `now` (the
        id in `sampled_token_ids`, one per sequence of the plan, when the caller has them);
        return the sequences that left (finished, or handed off when `prefill_only`)."""
        kv = self.kv
        eos = self.eos_token_id if sampled_token_ids is not None else None
        left = []
        tokens = repeat(None) if sampled_token_ids is None else sampled_token_ids
        for seq, n, token in zip(plan.seqs, plan.new_tokens, tokens):
            seq.num_computed += n
            if seq.num_computed < seq.num_tokens:
                continue  # a prompt chunk: no token yet
            seq.num_tokens += 1
            if seq.first_token_s is None:
                seq.first_token_s = now
            seq.last_token_s = now
            if seq.token_times is not None:
                seq.token_times.append(now)
            if token is not None and seq.token_ids is not None:
                seq.token_ids.append(token)
            if kv.prefix_caching and seq.shared * kv.hash_block_tokens < seq.prompt_tokens:
                kv.on_prompt_computed(seq)
            if seq.num_tokens - seq.prompt_tokens >= seq.max_output_tokens or (eos is not None and token == eos):
                seq.finish_s = now
                left.append(seq)
            elif self.prefill_only:
                left.append(seq)
        if left:
            self.retire(left)
        return left

    def retire(self, left: list[Sequence]) -> None:
        """Drop sequences that left from the batch; free the cache of the finished ones."""
        for seq in left:
            self.running.remove(seq)
            if seq.finish_s is not None:
                self.kv.release(seq)

    def release(self, seq: Sequence) -> None:
        """Free a handed-off sequence's cache (disaggregation: once it has been transferred)."""
        self.kv.release(seq)


class ContinuousBatching(Scheduler):
    """Prefill first: admit whole prompts while they fit, else decode the running batch.

    max_num_batched_tokens defaults to max(max_model_len, 2048), vLLM's default without chunked
    prefill, and may not be smaller than max_model_len (a long prompt could never run).
    """

    def __init__(self, kv: BlockPool, max_num_seqs: int = 256, max_num_batched_tokens: int | None = None,
                 max_model_len: int | None = None, order: Order | None = None, prefill_only: bool = False,
                 **kw):
        super().__init__(kv, max_num_seqs, max_num_batched_tokens, max_model_len, order, prefill_only, **kw)
        if self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens {self.max_num_batched_tokens} < max_model_len {self.max_model_len}: "
                f"without chunked prefill a long prompt could never be scheduled; raise it or use chunked")

    def schedule(self, now: float) -> ScheduledPass | None:
        return (self.waiting and self._admit_prompts()) or self._decode_running()

    def _admit_prompts(self) -> ScheduledPass | None:
        """A prefill pass of as many waiting prompts, in rank order, as fit."""
        if not self.waiting:
            return None
        seqs, new, ctx = [], [], []
        _, swap_in = self._admit_waiting(self.max_num_batched_tokens, True, seqs, new, ctx)
        return ScheduledPass(seqs, new, ctx, swap_in=swap_in) if seqs else None


class ChunkedPrefill(Scheduler):
    """A token budget per pass: running decodes, then continuing prompt chunks, then new prompts.

    max_num_batched_tokens (the budget) defaults to 2048 and may not be below max_num_seqs, so
    that every running sequence can decode in every pass.
    """

    def __init__(self, kv: BlockPool, max_num_seqs: int = 256, max_num_batched_tokens: int | None = 2048,
                 max_model_len: int | None = None, order: Order | None = None, prefill_only: bool = False,
                 **kw):
        super().__init__(kv, max_num_seqs, max_num_batched_tokens, max_model_len, order, prefill_only, **kw)
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens {self.max_num_batched_tokens} < max_num_seqs "
                             f"{self.max_num_seqs}: some running sequences could never decode")

    def schedule(self, now: float) -> ScheduledPass | None:
        decoding = [s for s in self.running if s.num_tokens - s.num_computed == 1]
        prefilling = [s for s in self.running if s.num_tokens - s.num_computed > 1]
        seqs, new, preempted, swap_out, budget = self._grow_or_preempt(decoding + prefilling,
                                                                        self.max_num_batched_tokens)
        ctx = [s.num_computed for s in seqs]
        before = len(seqs)
        budget, swap_in = self._admit_waiting(budget, False, seqs, new, ctx)
        if not seqs:
            return None
        decode = not prefilling and len(seqs) == before
        return ScheduledPass(seqs, new, ctx, preempted, swap_out, swap_in, decode)


class StaticBatching(Scheduler):
    """Wait for `batch_size` requests (or the first in line to have waited `timeout_s`), then run
    the batch to completion: one prefill pass, decode passes until its longest output is done.

    Each admitted request reserves the cache for its whole prompt + output, so nothing is ever
    preempted. Finished requests stop producing tokens and drop out of the passes, but their
    cache stays reserved and nothing new joins until the whole batch is done.
    """

    # Timeouts are honoured to the nanosecond, so float rounding of a wake-up time can't stall.
    _EPS = 1e-9

    def __init__(self, kv: BlockPool, batch_size: int = 8, timeout_s: float = 0.0,
                 max_model_len: int | None = None, order: Order | None = None, **kw):
        super().__init__(kv, batch_size, None, max_model_len, order, **kw)
        if not timeout_s >= 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s}")
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.held: list[Sequence] = []  # finished members of the batch in flight

    def schedule(self, now: float) -> ScheduledPass | None:
        self.next_wakeup = None
        if self.running:
            seqs = self.running
            return ScheduledPass(seqs, [1] * len(seqs), [s.num_computed for s in seqs], decode=True)
        if not self.waiting:
            return None
        head = self.waiting[0][1]
        due = head.arrival_s + self.timeout_s
        if len(self.waiting) < self.batch_size and now < due - self._EPS:
            self.next_wakeup = due
            return None
        seqs = []
        while self.waiting and len(seqs) < self.batch_size:
            seq = self.waiting[0][1]
            if not self.kv.allocate(seq, seq.prompt_tokens + seq.max_output_tokens - 1):
                break
            heappop(self.waiting)
            seqs.append(seq)
        self.running = list(seqs)
        return ScheduledPass(seqs, [s.prompt_tokens for s in seqs], [0] * len(seqs))

    def retire(self, left: list[Sequence]) -> None:
        self.running = [s for s in self.running if s not in left]
        self.held.extend(left)
        if not self.running:
            for seq in self.held:
                self.kv.release(seq)
            self.held = []


class DecodePriority(ContinuousBatching):
    """Continuous batching that favours decodes, as TGI's router does: new prompts are admitted
    only when the batch is empty, when waiting requests reach `waiting_served_ratio` times the
    running ones, or after `max_waiting_passes` decode passes since the last prefill."""

    def __init__(self, kv: BlockPool, waiting_served_ratio: float = 1.2, max_waiting_passes: int = 20, **kw):
        super().__init__(kv, **kw)
        if max_waiting_passes < 1:
            raise ValueError(f"max_waiting_passes must be at least 1, got {max_waiting_passes}")
        self.waiting_served_ratio = waiting_served_ratio
        self.max_waiting_passes = max_waiting_passes
        self.decodes_since_prefill = 0

    def holds_prompts_back(self) -> bool:
        """Whether waiting prompts wait for now: the batch decodes, too few wait, and fewer than
        `max_waiting_passes` decode passes have run since the last prefill."""
        return (bool(self.running) and bool(self.waiting)
                and len(self.waiting) < self.waiting_served_ratio * len(self.running)
                and self.decodes_since_prefill < self.max_waiting_passes)

    def schedule(self, now: float) -> ScheduledPass | None:
        if self.holds_prompts_back():
            return self._decode_running()
        return super().schedule(now)

    def _admit_prompts(self) -> ScheduledPass | None:
        plan = super()._admit_prompts()
        if plan is not None:
            self.decodes_since_prefill = 0
        return plan

    def _decode_running(self) -> ScheduledPass | None:
        self.decodes_since_prefill += 1
        return super()._decode_running()


POLICIES = {
    "static": StaticBatching,
    "continuous": ContinuousBatching,
    "chunked": ChunkedPrefill,
    "decode-priority": DecodePriority,
}
ORDERS = {"fcfs": None, "priority": by_priority, "spf": shortest_prompt_first}


def make_scheduler(policy: str, kv: BlockPool, *, max_num_seqs: int = 256, max_num_batched_tokens: int | None = None,
                   max_model_len: int | None = None, order: str = "fcfs", preemption: str = "recompute",
                   batch_size: int = 8, batch_timeout_s: float = 0.5, **kw) -> Scheduler:
    """A scheduler by the names the command lines use (the simulator's and the engine's alike);
    `max_num_batched_tokens` None keeps the policy's default."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; choose from {', '.join(ORDERS)}")
    if policy == "static":
        return StaticBatching(kv, batch_size, batch_timeout_s, max_model_len, ORDERS[order], preemption=preemption, **kw)
    budget = {"max_num_batched_tokens": max_num_batched_tokens} if max_num_batched_tokens else {}
    return POLICIES[policy](kv, max_num_seqs=max_num_seqs, max_model_len=max_model_len, order=ORDERS[order],
                            preemption=preemption, **budget, **kw)
