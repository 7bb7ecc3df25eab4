"""Fast-forward: the simulator's way of advancing a run of identical decode passes in one step.

Simulator-only machinery, kept out of `core.scheduler` (which the real engine runs): these
functions read and update a scheduler's state exactly as k rounds of `schedule` +
`on_pass_done` would, without planning each pass.

A plan is *steady* when it is a decode pass of the whole running batch with nobody preempted:
until a sequence finishes, something arrives or the cache runs short, the scheduler would plan
the same pass again with every context one longer. `steady_passes` says how many such passes
can repeat; `apply_passes` applies k of them at once.
"""
from __future__ import annotations

from core.kv import blocks_for
from core.scheduler import DecodePriority, ScheduledPass, Scheduler, Sequence, StaticBatching


def is_steady(scheduler: Scheduler, plan: ScheduledPass) -> bool:
    """Would the scheduler plan this very pass again (contexts one longer) until something
    changes?"""
    return plan.decode and not plan.preempted and len(plan.seqs) == len(scheduler.running)


def admits_newcomers(scheduler: Scheduler) -> bool:
    """Could a request arriving now join the batch before a running sequence leaves? (False
    lets the simulator carry on with a run of passes undisturbed.)"""
    if isinstance(scheduler, StaticBatching):
        return not scheduler.running
    return len(scheduler.running) < scheduler.max_num_seqs


def steady_passes(scheduler: Scheduler, plan: ScheduledPass) -> int:
    """How many passes, this one included, would repeat a steady plan before a sequence
    finishes or the cache runs short, barring arrivals."""
    seqs = plan.seqs
    k = min([s.max_output_tokens - s.num_tokens + s.prompt_tokens for s in seqs])
    if k <= 1 or scheduler.prefill_only:
        return 1
    kv = scheduler.kv
    room, bs = kv.room(), kv.block_size
    if room < len(seqs) * (k // bs + 1):  # k passes grow no sequence by more blocks than that

        def need(passes: int) -> int:  # blocks the passes after this one will ask for
            return sum(max(0, blocks_for(s.num_computed + passes, bs) - len(s.block_table)) for s in seqs)

        if need(k) > room:
            lo, hi = 1, k  # need(lo) <= room < need(hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if need(mid) <= room:
                    lo = mid
                else:
                    hi = mid
            k = lo
    if isinstance(scheduler, DecodePriority):
        scheduled_with = scheduler.decodes_since_prefill - 1  # the count this pass was planned with
        if scheduler.waiting and scheduled_with < scheduler.max_waiting_passes and \
                len(scheduler.waiting) < scheduler.waiting_served_ratio * len(scheduler.running):
            k = min(k, scheduler.max_waiting_passes - scheduled_with)  # then prompts get their turn
    return k


def apply_passes(scheduler: Scheduler, plan: ScheduledPass, k: int, first_end_s: float, end_s: float,
                 times: list[float] | None = None) -> list[Sequence]:
    """Apply `k` repetitions of a steady plan at once, leaving the state k rounds of schedule +
    on_pass_done would. first_end_s / end_s: when the first and the last pass ended; `times`:
    all k end times, when token times are kept. Returns the sequences that finished."""
    if isinstance(scheduler, DecodePriority):
        scheduler.decodes_since_prefill += k - 1
    more = k
    if scheduler.kv.prefix_caching or None in [s.first_token_s for s in plan.seqs]:
        # The first pass may end a prompt (its first token, its prefix blocks): step it.
        left = scheduler.on_pass_done(plan, first_end_s)
        if k == 1 or left:
            if k > 1:
                raise RuntimeError(f"fast-forward past a sequence leaving after the first pass: {left}")
            return left
        more, times = k - 1, times and times[1:]
    left = []  # from here on, every pass is a decode of every sequence
    allocate = scheduler.kv.allocate
    for seq in plan.seqs:
        if not allocate(seq, seq.num_computed + more):
            raise RuntimeError(f"fast-forward of {k} passes ran out of KV blocks for {seq}")
        seq.num_computed += more
        seq.num_tokens += more
        seq.last_token_s = end_s
        if seq.token_times is not None:
            seq.token_times.extend(times)
        if seq.num_tokens - seq.prompt_tokens >= seq.max_output_tokens:
            seq.finish_s = end_s
            left.append(seq)
    if left:
        scheduler.retire(left)
    return left
