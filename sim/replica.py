"""One replica: the SimPy process that runs a scheduler's passes, as the engine's loop does.

The loop is the real engine's loop with the GPU replaced by a cost model: ask the scheduler
for a plan, spend the pass's duration, hand the pass back (`core.scheduler` documents the calls).

Runs of identical decode passes are advanced in one step, exactly. When a plan is steady (every
running sequence decodes, nothing admitted or preempted), the scheduler says how many passes
can repeat before a sequence finishes or the cache runs short, and the cost model says pass j
takes a + b*j seconds, so k passes take k*a + b*k*(k-1)/2. Where heat (`sim.heat`) slows them,
each pass's slow-down follows the level at its start, which decays over the run: the run's
passes are then priced one by one as stepping prices them (`DecodeRun`), still in one step.
An arrival (or freed memory) during such a run interrupts it: the replica finishes the pass in
flight and plans again, at the same pass boundary where it would have planned had it gone pass
by pass (with overlap, the boundary whose plan, made while the pass before ran, saw it).
"""
from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from typing import Callable

import simpy

from core.kv import blocks_for
from core.records import PassRecord
from core.scheduler import ScheduledPass, Scheduler, Sequence
from sim.cost import CostModel
from sim.fastforward import admits_newcomers, apply_passes, is_steady, steady_passes
from sim.heat import HeatState
from sim.host import HostTime


# Two instants this close are one: news that lands within TIE_S of a pass boundary is treated as
# arriving at it, however the float rounding of the boundary went (stepping adds durations one by
# one, fast-forward computes a run's boundaries in closed form).
TIE_S = 1e-9
PRICED_AHEAD = 32  # passes of a heated decode run priced at a time (sim.replica.DecodeRun)


def run_time(a: float, b: float, k: int) -> float:
    """Seconds for the first k passes of a run whose pass j takes a + b*j."""
    return a * k + b * (k * (k - 1) // 2)


def passes_started(a: float, b: float, elapsed: float, k: int) -> int:
    """How many of a k-pass run's passes have started `elapsed` seconds in: the pass in flight
    counts, since a newcomer waits for it to end (but at least one pass has always started)."""
    h = a - b / 2  # run_time(j) = (b/2) j^2 + h j; solve for j, then correct the rounding
    root = math.sqrt(max(0.0, h * h + 2 * b * elapsed))
    j = min(k, int(2 * elapsed / (h + root))) if h + root > 0 else 0
    t = a * j + b * (j * (j - 1) // 2)  # run_time(a, b, j)
    while j < k and t + a + b * j <= elapsed:  # pass j+1 ended by then
        t += a + b * j
        j += 1
    while j > 0 and t > elapsed:
        j -= 1
        t -= a + b * j
    if t < elapsed - TIE_S:
        j += 1  # a pass is in flight (news within TIE_S of a boundary counts as at the boundary)
    return min(k, max(1, j))


class DecodeRun:
    """k decode passes of a steady plan from `start`, pass j taking a + b*j seconds rested.

    Without heat (or with none left to slow them) a pass takes its rested time and the run's
    boundaries are in closed form. With heat, each pass's slow-down depends on the level at its
    start, which decays over the run: the passes are priced one by one as stepping prices them
    (`HeatState.slowed`, then `passed`), into a table of their end times and the level after each,
    PRICED_AHEAD passes at a time as the run reaches them (news often cuts a run short).
    """

    def __init__(self, plan: ScheduledPass, start: float, k: int, a: float, b: float, heat: HeatState | None):
        self.plan, self.start, self.k, self.a, self.b = plan, start, k, a, b
        self.ends: list[float] | None = None  # with heat: when each pass priced so far ends, as stepping adds them up
        self.levels: list[float] = []  # with heat: the level as each of those passes ends
        self.u = 0.0  # the passes' load (sim.heat)
        if heat is None:
            return
        model = heat.heat
        u, kappa = model.load(plan.new_tokens), model.kappa_of(plan.new_tokens, plan.context_lens)
        self.u = u
        if not kappa or not (u or heat.value(start)):  # every pass takes its rested time
            return
        self.ends, self.kappa, self.tau = [], kappa, model.tau_s
        if u or not model.tau_s:  # (a decode pass puts no load on the card: never, but priced the same way)
            self.probe = HeatState(model)
            self.probe.level, self.probe.at = heat.level, heat.at
        else:
            self.probe, self.level = None, heat.value(start)

    def price(self, m: int) -> None:
        """Price the passes up to the m-th (of k) into the table."""
        ends, levels, a, b, kappa = self.ends, self.levels, self.a, self.b, self.kappa
        t = ends[-1] if ends else self.start
        m = min(m, self.k)
        if self.probe is not None:
            probe, u = self.probe, self.u
            for j in range(len(ends), m):
                duration = probe.slowed(t, a + b * j, u, kappa)
                probe.passed(t, duration, u)
                t += duration
                ends.append(t)
                levels.append(probe.level)
            return
        # HeatState.slowed then .passed with u = 0, written out: the same arithmetic, faster
        tau, exp, h = self.tau, math.exp, self.level
        for j in range(len(ends), m):
            rested = a + b * j
            if 1.0 + kappa * h == 1.0:  # no slow-down left in floating point, here or after
                duration = rested
            else:
                duration = rested * (1.0 + kappa * (h * (tau / rested * (1.0 - exp(-rested / tau)))))
                duration = rested * (1.0 + kappa * (h * (tau / duration * (1.0 - exp(-duration / tau)))))
            h = h * exp(-duration / tau)
            t += duration
            ends.append(t)
            levels.append(h)
        self.level = h

    def next_stop(self) -> int:
        """The pass at whose end the run next wakes: its last, or (with heat) the last of the passes
        priced next."""
        if self.ends is None:
            return self.k
        m = min(self.k, len(self.ends) + PRICED_AHEAD)
        self.price(m)
        return m

    def end(self, j: int) -> float:
        """When the first j passes have ended (j = 0: the start)."""
        if self.ends is None:
            return self.start + run_time(self.a, self.b, j)
        if j > len(self.ends):
            self.price(j)
        return self.ends[j - 1] if j else self.start

    def duration(self, j: int) -> float:
        """How long pass j (from 0) takes."""
        if self.ends is None:
            return self.a + self.b * j
        return self.ends[j] - self.end(j)

    def started(self, now: float) -> int:
        """How many passes have started by `now` (as `passes_started`)."""
        if self.ends is None:
            return passes_started(self.a, self.b, now - self.start, self.k)
        while len(self.ends) < self.k and (not self.ends or self.ends[-1] < now):  # price up to now
            self.price(len(self.ends) + PRICED_AHEAD)
        j = bisect_right(self.ends, now)  # passes ended by now
        if self.end(j) < now - TIE_S:
            j += 1
        return min(self.k, max(1, j))

    def heat_after(self, heat: HeatState, now: float) -> None:
        """Leave `heat` as the run's passes, stepped, would have (the run ran k passes, to `now`)."""
        if self.ends is None:
            heat.passed(self.start, now - self.start, self.u)
        else:
            heat.level, heat.at = self.levels[self.k - 1], self.ends[self.k - 1]


def settle_s(replicas: list["Replica"], now: float) -> float | None:
    """How long news at `now` waits before a router reads these replicas (None: not at all):
    until every pass in flight that ends within TIE_S of it has ended, its end handled. Stepping
    (durations added one by one) and fast-forward (boundaries in closed form) round such a
    boundary to either side of `now`; news on a boundary comes after it, as the replica loop
    takes it, so both show a router the same state."""
    ends = [t for t in (r.ends_within_tie(now) for r in replicas) if t is not None]
    return max(ends) - now if ends else None


@dataclass(frozen=True)
class SwapLink:
    """Where swapped-out KV cache goes and comes back from: host memory over a link of
    `bytes_per_s`, `bytes_per_token` of cache a token. Copies don't contend with each other."""

    bytes_per_token: int
    bytes_per_s: float

    def __post_init__(self) -> None:
        if not (self.bytes_per_s > 0 and self.bytes_per_token > 0):
            raise ValueError("a swap link needs positive bytes_per_token and bytes_per_s")

    def seconds(self, plan: ScheduledPass) -> float:
        """Time to copy a pass's swapped-out and swapped-in caches, one after the other."""
        swap_s = 0.0
        for seq, _ in plan.swap_out:
            swap_s += seq.num_computed * self.bytes_per_token / self.bytes_per_s
        for seq, _ in plan.swap_in:
            swap_s += seq.num_computed * self.bytes_per_token / self.bytes_per_s
        return swap_s


class Replica:
    """A model instance: a scheduler, a cost model, and the process running its passes.

    on_leave(seq, replica) is called for every sequence that leaves (finished, or handed off).
    pass_log, when a list, receives a PassRecord per pass (fast-forwarded ones included).
    swap_link prices the swaps of a scheduler that preempts by swapping.
    overlap: the engine's overlap mode (`engine.continuous`), where each pass is planned while the
        one before it runs: a request arriving during a pass is seen by the plan made at the end of
        the next one (unless the replica would otherwise have nothing to run).
    host: the engine's host time (`sim.host`): a pass planned while no pass is in flight (after
        the replica slept, or, with overlap, when the plan before it found nothing) starts
        `host.idle_delay` after it was planned; a pass planned while another runs starts when
        that one ends.
    """

    def __init__(self, env: simpy.Environment, index: int, scheduler: Scheduler, cost: CostModel,
                 on_leave: Callable[[Sequence, "Replica"], None] | None = None, *, fast_forward: bool = True,
                 pass_log: list[PassRecord] | None = None, run_id: str = "sim", swap_link: SwapLink | None = None,
                 overlap: bool = False, host: HostTime | None = None):
        if scheduler.swap and swap_link is None:
            raise ValueError("a scheduler that preempts by swapping needs a swap link to price the copies")
        self.env, self.index, self.scheduler, self.cost = env, index, scheduler, cost
        self.swap_link = swap_link
        self.overlap = overlap
        self.host = host if host is not None and not host.zero else None
        heat = getattr(cost, "heat", None)  # recent prompt work slowing the next passes (sim.heat)
        self.heat = HeatState(heat) if heat is not None and not heat.zero else None
        self.in_flight = False  # the engine has a pass in flight when it plans the next (else: host delay)
        self.woke = False  # the replica slept for lack of work since its last pass
        self.busy = False  # a pass (or a run of passes) is in flight
        self.busy_until: float | None = None  # when the pass (or run) in flight ends
        # overlap: (request, when it reached this replica) for those that came during a pass, not yet
        # seen by the scheduler (a request handed over by a prefill replica reaches it after its arrival)
        self.deferred: list[tuple[Sequence, float]] = []
        self.last_start = 0.0  # when the last pass that ended had started
        self.host_free_at = 0.0  # overlap: when the host is done launching the pass it planned last
        self.on_leave = on_leave
        self.fast_forward = fast_forward
        self.pass_log = pass_log
        self.run_id = run_id
        self.num_passes = 0
        self.num_steps = 0  # simulation steps: passes run one by one plus fast-forwarded runs
        self.wakeup: simpy.Event | None = None  # set while idle: news triggers it
        self.interruptible = False  # in a timed wait (a run of passes, a timeout): news interrupts it
        self.run: DecodeRun | None = None  # the fast-forwarded run in flight
        self.process = env.process(self.loop())

    # ------------------------------------------------------------------ news from outside

    def add(self, seq: Sequence) -> str | None:
        """A request routed here: queued (and the loop told, if it could join now), or rejected
        with the reason returned."""
        if self.overlap and self.busy:
            reason = self.scheduler.check(seq)
            if reason is not None:
                seq.rejected = reason
                return reason
            self.deferred.append((seq, self.env.now))
        else:  # (a sleeping engine's lag in noticing it is part of its first pass's host delay)
            reason = self.scheduler.add(seq, self.env.now)
            if reason is not None:
                return reason
        if self.run is None or admits_newcomers(self.scheduler):
            self.notify()
        return None

    def notify(self) -> None:
        """Something changed outside the loop: plan again at the next pass boundary."""
        if self.wakeup is not None:
            wakeup, self.wakeup = self.wakeup, None
            wakeup.succeed()
        elif self.interruptible:
            self.interruptible = False
            self.process.interrupt()

    @property
    def num_outstanding(self) -> int:
        """Requests routed here and not finished (what routers balance)."""
        return self.scheduler.num_outstanding + len(self.deferred)

    @property
    def kv_load(self) -> float:
        """KV blocks in use plus the blocks the waiting prompts will need, as a fraction of the
        cache (what the least-kv router balances)."""
        kv = self.scheduler.kv
        queued = sum(kv.blocks_for(s.num_tokens) for _, s in self.scheduler.waiting)
        queued += sum(kv.blocks_for(s.num_tokens) for s, _ in self.deferred)
        return (self.kv_used_blocks() + queued) / kv.num_blocks

    def kv_used_blocks(self) -> int:
        """KV blocks in use now, counting the passes of a fast-forwarded run that have started."""
        kv = self.scheduler.kv
        used = kv.used_blocks()
        if self.run is None:
            return used
        j = self.run.started(self.env.now)
        bs = kv.block_size
        return used + sum(max(0, blocks_for(c + j, bs) - len(s.block_table))
                          for s, c in zip(self.run.plan.seqs, self.run.plan.context_lens))

    def ends_within_tie(self, now: float) -> float | None:
        """When the pass (or run) in flight ends, if that is within TIE_S after `now`: what this
        replica shows a router then is what it shows once that pass is done (see `settle_s`)."""
        end = self.busy_until
        return end if end is not None and now <= end <= now + TIE_S else None

    # ------------------------------------------------------------------ the loop

    def loop(self):
        env, scheduler = self.env, self.scheduler
        peek, schedule, fast_forward = env.peek, scheduler.schedule, self.fast_forward
        while True:
            now = env.now
            if peek() - now <= TIE_S:  # let what happens at this very instant (an arrival) happen first
                yield env.timeout(peek() - now)
                now = env.now
            # overlap: this plan is made once the host has read the tokens of the pass before the
            # one that just ended, and has launched the pass it planned last
            seen_by = now
            if self.host is not None and self.in_flight:
                seen_by = min(now, max(self.last_start, self.host_free_at) + self.host.retire_s)
            elif self.in_flight:
                seen_by = self.last_start
            if self.deferred:
                self.release_deferred(seen_by)
            plan = schedule(now)
            if plan is None and self.deferred:  # with nothing else to run, the engine plans again at once
                self.release_deferred(now)
                plan = schedule(now)
                seen_by = now
                self.in_flight = False  # (after the pass in flight ended: the GPU waits for this plan)
            if plan is None:
                self.busy = False
                self.in_flight = False
                yield from self.idle(scheduler.next_wakeup)
                self.woke = True
                continue
            self.busy = True
            if self.host is not None:
                self.host_free_at = seen_by + self.host.launch_time(plan)
            if self.host is not None and not self.in_flight:
                yield env.timeout(self.host.idle_delay(plan, self.woke))
            self.in_flight, self.woke = True, False
            # (requests deferred now are seen at the end of the next pass: that pass goes alone)
            run = self.decode_run(plan) if fast_forward and not self.deferred and is_steady(scheduler, plan) else None
            if run is None:
                yield from self.one_pass(plan)
            else:
                yield from self.decode_passes(plan, run)

    def release_deferred(self, seen_by: float) -> None:
        """Hand the scheduler the deferred requests that arrived by `seen_by`."""
        keep = []
        for seq, at in self.deferred:
            if at <= seen_by + TIE_S:
                self.scheduler.add(seq, max(at, seen_by))  # the engine's host took it in when it planned
            else:
                keep.append((seq, at))
        self.deferred = keep

    def idle(self, wake_at: float | None):
        """Nothing to run: sleep until news arrives (or until the scheduler's wake-up time)."""
        env = self.env
        if wake_at is None:
            self.wakeup = env.event()
            yield self.wakeup
            return
        self.interruptible = True
        try:
            yield env.timeout(max(0.0, wake_at - env.now))
        except simpy.Interrupt:
            pass
        self.interruptible = False

    def one_pass(self, plan: ScheduledPass):
        env = self.env
        start = env.now
        plan.started(start)
        duration = self.cost.pass_time(plan.new_tokens, plan.context_lens)
        if self.heat is not None:
            u = self.heat.heat.load(plan.new_tokens)
            kappa = self.heat.heat.kappa_of(plan.new_tokens, plan.context_lens)
            duration = self.heat.slowed(start, duration, u, kappa)
            self.heat.passed(start, duration, u)
        if plan.swap_out or plan.swap_in:
            duration += self.swap_link.seconds(plan)
        self.busy_until = start + duration
        yield env.timeout(duration)
        self.busy_until = None
        self.last_start = start
        self.num_steps += 1
        if self.pass_log is not None:
            self.pass_log.append(PassRecord.make(self.run_id, "sim", self.num_passes, plan.new_tokens,
                                                 plan.context_lens, start, duration, self.index))
        self.num_passes += 1
        self.leave(self.scheduler.on_pass_done(plan, start + duration))  # == env.now

    def decode_run(self, plan: ScheduledPass) -> "DecodeRun | None":
        """The run of passes this steady plan repeats (more than one), priced as stepping would
        price them; else None."""
        k = steady_passes(self.scheduler, plan)
        if k <= 1:
            return None
        line = self.cost.decode_line(len(plan.seqs), sum(plan.context_lens), max(plan.context_lens))
        if line is None:
            return None
        a, b, valid = line
        k = min(k, valid)
        if k <= 1:
            return None
        return DecodeRun(plan, self.env.now, k, a, b, self.heat)

    def decode_passes(self, plan: ScheduledPass, run: "DecodeRun"):
        """A run of decode passes in one step, cut short at the first pass boundary after news."""
        env = self.env
        self.run = run
        self.interruptible = True
        host_free_at = self.host_free_at
        try:
            while True:
                m = run.next_stop()
                if m == run.k:
                    self.busy_until = run.end(m)
                yield env.timeout(run.end(m) - env.now)
                if m == run.k:
                    break
        except simpy.Interrupt:
            # the news joins at the next boundary; with overlap the pass after it is planned already,
            # unless that plan still saw it (it came as the pass began, or within the host's retire_s)
            j = run.started(env.now)
            if self.overlap and env.now > self.seen_by_plan(run, j, host_free_at) + TIE_S:
                j += 1
            run.k = min(run.k, j)
            end = self.busy_until = run.end(run.k)
            if end > env.now:
                yield env.timeout(end - env.now)
        self.interruptible = False
        self.run = self.busy_until = None
        k = run.k
        if self.overlap and self.host is not None and k > 1:  # as planning each of its passes would have left it
            self.host_free_at = self.seen_by_plan(run, k - 1, host_free_at) + self.host.launch_time(plan)
        if self.heat is not None:
            run.heat_after(self.heat, env.now)
        self.last_start = run.end(k - 1)
        self.num_steps += 1
        times = None
        if self.pass_log is not None or plan.seqs[0].token_times is not None:
            times = [run.end(j) for j in range(1, k + 1)]
            times[-1] = env.now
        if self.pass_log is not None:
            new = plan.new_tokens
            for j in range(k):
                self.pass_log.append(PassRecord(
                    run_id=self.run_id, engine="sim", step=self.num_passes + j, kind="decode", new_tokens=new,
                    context_lens=[c + j for c in plan.context_lens], start_s=run.end(j),
                    duration_s=run.duration(j), replica=self.index))
        self.num_passes += k
        left = apply_passes(self.scheduler, plan, k, run.end(1), env.now, times)
        if left:
            self.leave(left)

    def seen_by_plan(self, run: DecodeRun, j: int, host_free_at: float) -> float:
        """With overlap: the latest arrival the plan made at the end of the run's pass j (from 1)
        sees, as the loop computes it pass by pass (`host_free_at`: as the run's first pass was
        planned)."""
        if self.host is None:
            return run.end(j - 1)
        retire, launch = self.host.retire_s, self.host.launch_time(run.plan)
        for i in range(1, j + 1):
            seen = min(run.end(i), max(run.end(i - 1), host_free_at) + retire)
            host_free_at = seen + launch
        return seen

    def leave(self, seqs: list[Sequence]) -> None:
        if seqs and self.on_leave is not None:
            for seq in seqs:
                self.on_leave(seq, self)
