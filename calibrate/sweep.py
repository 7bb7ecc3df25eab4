"""Timing the continuous engine's runner directly on chosen pass shapes.

Not through a workload: each shape (per sequence, how many new tokens on top of how much
cached context) is built as a plan, turned into a batch and run by `engine.continuous.
ModelRunner` exactly as an open run would, and timed with CUDA events. Decode over batch sizes
(every graph bucket and sizes between them) and context lengths (uniform and mixed within a
batch), prompt chunks on top of cached context, several prompts in one pass, and mixed passes
(a chunk beside decodes, as chunked prefill builds them), and batches like the ones served
workloads build (the part0 workload's five prompts with some tokens generated; a long tail of contexts, as
in the Azure conversation trace; prompts of mixed lengths in one pass; the part0 workload's prompts grouped
as a loaded engine groups them, which its CUDA graphs run padded to the next token bucket). Every shape once untimed,
then rounds over all shapes in a new random order each; one PassRecord per timed pass.

The cache holds random values (timing does not depend on them, but zeros can run faster);
the block tables are made up, sequences laid out one after another from block 0.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np
import torch

from core.records import PassRecord, pass_kind
from core.scheduler import ScheduledPass, Sequence
from engine.continuous import ModelRunner, build_host_batch, graph_buckets


@dataclass(frozen=True)
class Shape:
    """One pass: (context, new tokens) per sequence, and the group it belongs to (for held-out
    error by shape, never by random rows)."""

    group: str
    seqs: tuple[tuple[int, int], ...]

    @property
    def tokens_held(self) -> int:
        return sum(c + n for c, n in self.seqs)


SEED_PROMPTS = (16, 64, 256, 1024, 4096)  # the part0 workload's prompt lengths (p16 ... p4096)
# the part0 workload's prompts as a loaded engine puts several of them in one pass: their sums fall off the
# token buckets, so the pass's CUDA graph runs padded (4,096 + 64 tokens at 8,192), which passes of
# prompts of equal powers of two never are; and two past the largest bucket
SEED_GROUPS = ((4096, 16), (4096, 64), (4096, 256), (4096, 1024), (1024, 16), (1024, 64), (1024, 256), (256, 16),
               (256, 64), (64, 16), (4096, 1024, 256), (1024, 256, 64), (1024, 1024, 256), (256, 64, 16),
               (4096, 1024, 256, 64, 16), (1024, 256, 64, 16), (1024, 1024, 1024, 256), (4096, 4096, 1024),
               (4096, 4096, 1024, 256, 16))


def log_contexts(rng: random.Random, n: int, low: int, high: int) -> list[int]:
    return [int(round(np.exp(rng.uniform(np.log(low), np.log(high))))) for _ in range(n)]


GRID_TOKENS_HELD = 2_000_000  # the grid's largest batches' cached positions (57 GB of the 1.5B's KV cache)


def default_shapes(max_batch: int = 256, max_context: int = 16384, max_tokens_held: int = GRID_TOKENS_HELD,
                   seed: int = 0, max_pass_tokens: int = 32_768) -> list[Shape]:
    """The sweep's grid (a few hundred shapes): decode, prefill, mixed; passes of up to
    `max_pass_tokens` tokens (32,768, the engine's default max_num_batched_tokens: closed batches'
    single prompt passes of up to 262,144 tokens join with more)."""
    rng = random.Random(seed)
    shapes = []
    sizes = sorted(set(graph_buckets(max_batch)) | {3, 5, 6, 12, 20, 28, 40, 100, 200, 300, 600, 1000}
                   & set(range(1, max_batch + 1)))
    # uniform contexts off the attention kernel's slicing steps (a step every 128 positions for
    # small batches, every 1,024 for batches that fill the GPU): at 2,048 cached a sequence is two
    # whole slices and a slice of one position, the worst case of the expected-offset model
    # (sim.calibrated), which served contexts, spread over every offset, are not
    contexts = [c for c in (16, 100, 700, 1500, 2600, 6000, 16000) if c <= max_context]
    for b in sizes:
        for c in contexts:
            shapes.append(Shape(f"decode b{b} c{c}", tuple((c, 1) for _ in range(b))))
        shapes.append(Shape(f"decode b{b} mixed", tuple((c, 1) for c in log_contexts(rng, b, 16, max_context))))
    # decode batches as served workloads build them: the part0 workload's prompts with 0-255 tokens generated
    # each, and a long tail of contexts (log-normal, median 1,000 positions)
    for b in (3, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 384, 512, 768):
        if b <= max_batch:
            seed_ctx = [rng.choice(SEED_PROMPTS) + rng.randrange(256) for _ in range(b)]
            tail = [int(min(max(rng.lognormvariate(math.log(1000), 1.0), 16), max_context)) for _ in range(b)]
            for name, ctx in (("seed", seed_ctx), ("tail", tail)):
                shapes.append(Shape(f"decode b{b} {name}", tuple((min(c, max_context), 1) for c in ctx)))
    for n in (16, 64, 256, 1024, 2048, 4096, 8192, 16384):
        for c in (0, 256, 1024, 4096, 16384):
            if n <= max_context and c <= max_context:
                shapes.append(Shape(f"prefill n{n} c{c}", ((c, n),)))
    for count, n in ((2, 512), (4, 256), (4, 1024), (8, 64), (8, 256), (16, 128), (3, 2048), (32, 16),
                     (8, 2048), (16, 1024), (32, 1024), (24, 1344), (4, 4096), (64, 256),
                     # passes of more than 8,192 tokens (no graph: launched kernel by kernel), as a
                     # saturated engine builds them up to max_num_batched_tokens
                     (128, 128), (32, 512), (6, 2048), (3, 4096), (64, 512), (16, 2048), (8, 4096), (2, 16384)):
        if n <= max_context:
            shapes.append(Shape(f"prompts {count}x{n}", tuple((0, n) for _ in range(count))))
    # prompts of mixed lengths in one pass (log-normal, median 1,000 tokens), up to 32,768 tokens
    for count in (2, 3, 4, 6, 8, 12, 16, 24):
        lengths = [int(min(max(rng.lognormvariate(math.log(1000), 1.0), 16), max_context, 8192)) for _ in range(count)]
        while sum(lengths) > 32768:
            lengths.pop()
        shapes.append(Shape(f"prompts {len(lengths)} mixed", tuple((0, n) for n in lengths)))
    # closed batches put every prompt in one pass (`engine bench`): past max_num_batched_tokens, up
    # to the part0 workload's five prompts in turn at batch 192 (about 210,000 tokens)
    for count, n in ((128, 512), (256, 256), (512, 256), (64, 4096)):
        if n <= max_context and count * n <= max_pass_tokens:
            shapes.append(Shape(f"prompts {count}x{n}", tuple((0, n) for _ in range(count))))
    mix = tuple((0, SEED_PROMPTS[i % len(SEED_PROMPTS)]) for i in range(192))
    if max(n for _, n in mix) <= max_context and sum(n for _, n in mix) <= max_pass_tokens:
        shapes.append(Shape("prompts mix x192", mix))
    for n in (128, 512, 1024, 2048):
        for b in (1, 8, 32, 64, 128, 256):
            if b <= max_batch and n > b and n - b <= max_context:
                decodes = tuple((c, 1) for c in log_contexts(rng, b, 16, min(4096, max_context)))
                context = rng.choice([c for c in (0, 512, 2048) if c <= max_context])
                shapes.append(Shape(f"mixed n{n - b} b{b}", decodes + ((context, n - b),)))
    for lengths in SEED_GROUPS:
        if max(lengths) <= max_context and sum(lengths) <= max_pass_tokens:
            shapes.append(Shape("prompts seed " + "+".join(map(str, lengths)), tuple((0, n) for n in lengths)))
    # (a pass holds max_batch sequences at most: the runner's buffers are sized for that many)
    return [s for s in shapes if s.tokens_held <= max_tokens_held and len(s.seqs) <= max_batch]


def quick_shapes(shapes: list[Shape], max_batch: int) -> list[Shape]:
    """A reduced grid (`calibrate sweep --quick`, `calibrate run --quick`): the decode batches of
    `shapes` whose size is a power of two, a multiple of 64, or between the graph buckets (the
    sizes the fit holds out, so that the error report stands on as many shapes as the full
    grid's), every other shape kept. The decode buckets left out (72, 80, 88, ...) get their
    graphs' times interpolated between the timed ones (`CalibratedCost.graph_time`): a third of
    the full grid's shapes at 1,024 sequences, for a coarser graph-time table."""
    buckets = set(graph_buckets(max_batch))

    def kept(b: int) -> bool:
        return b & (b - 1) == 0 or b % 64 == 0 or b not in buckets
    return [s for s in shapes if not s.group.startswith("decode ") or kept(len(s.seqs))]


MIXTURE_BATCHES = (40, 64, 72, 80, 96, 104, 112, 120, 160, 256)


def mixture_shapes(max_batch: int = 256, max_context: int = 16384, seed: int = 0) -> list[Shape]:
    """Decode batches of spread contexts beside their twins of one context (the batch's mean), at
    batch sizes around the attention kernel's change of slicing (padded batches under 128 get
    128-position slices; from 128 the batch fills the GPU): the served batches of 65-127 sequences
    run 2-3% over a form that sees a batch by its mean and longest context, where the default grid
    has few spread batches there (`--grid mixtures`; not the calibration's grid)."""
    rng = random.Random(seed)
    top = min(8000, max_context)

    def lognormal(b: int, sigma: float) -> list[int]:
        return [int(min(max(rng.lognormvariate(math.log(top / 8), sigma), 16), top)) for _ in range(b)]

    def bimodal(b: int, short: int) -> list[int]:
        """`short` contexts of 16 to top/13 positions, the rest of top/2 to top/2 + top/32."""
        return [rng.randint(16, max(16, top // 13)) if i < short else rng.randint(top // 2, top // 2 + top // 32)
                for i in range(b)]

    designs = {"tail": lambda b: lognormal(b, 0.7), "wide": lambda b: lognormal(b, 1.0),
               "loguniform": lambda b: log_contexts(rng, b, 16, top),
               "bimodal50": lambda b: bimodal(b, b // 2), "bimodal25": lambda b: bimodal(b, b // 4)}
    shapes = []
    for b in MIXTURE_BATCHES:
        if b > max_batch:
            continue
        for name, draw in designs.items():
            ctx = draw(b)
            mean = round(sum(ctx) / b)
            shapes.append(Shape(f"decode b{b} {name}", tuple((c, 1) for c in ctx)))
            shapes.append(Shape(f"decode b{b} {name} twin", tuple((mean, 1) for _ in range(b))))
    return shapes


MIXED_BUDGETS = (512, 1024, 2048)  # a mixed pass's tokens, decodes included (the chunked policy's budget: 2,048)
MIXED_DECODES = (16, 32, 64, 96, 128, 160, 192, 256)


def mixed_shapes(max_batch: int = 1024, max_context: int = 16384, seed: int = 0) -> list[Shape]:
    """Mixed passes as the chunked policy builds them on a served trace (`--grid mixed`): a budget
    of 512, 1,024 or 2,048 tokens, 16-256 of them decodes of contexts like the Azure conversation
    trace's (log-normal, median 1,000 positions, up to 8,000), the rest one to three prompts' chunks
    (the first on a cached context of 0-4,096 positions, as a long prompt's later chunks are), and
    beside them the default grid's own mixed passes (the same shapes, to set cards side by side):
    the served passes of 100-180 decodes beside a chunk run 4-5% over a form fitted on the default
    grid's mixed passes, whose decodes are fewer and shorter."""
    anchors = [s for s in default_shapes(max_batch, max_context, seed=seed)
               if s.group.startswith("mixed ") and len(s.seqs) <= max_batch]  # (a pass holds max_batch sequences at most)
    rng = random.Random(seed + 1)
    top = min(8000, max_context)
    shapes = []
    for budget in MIXED_BUDGETS:
        for b in MIXED_DECODES:
            if b + 3 > max_batch or 2 * b > budget:
                continue
            for k in (1, rng.randint(2, 3)):
                decodes = tuple((int(min(max(rng.lognormvariate(math.log(1000), 0.8), 16), top)), 1) for _ in range(b))
                cuts = sorted(rng.sample(range(1, budget - b), k - 1))
                sizes = [hi - lo for lo, hi in zip([0] + cuts, cuts + [budget - b])]
                first = max(0, min(rng.choice((0, 512, 2048, 4096)), max_context - sizes[0]))
                chunks = tuple((first if i == 0 else 0, n) for i, n in enumerate(sizes))
                shapes.append(Shape(f"mixed served n{budget - b} b{b} k{k}", decodes + chunks))
    return anchors + shapes


def blocks_needed(shape: Shape, block_size: int) -> int:
    return sum(-(-(c + n) // block_size) for c, n in shape.seqs)


def tokens_that_fit(config, free_bytes: float, dtype_bytes: int = 2, reserve_bytes: float = 20 * 2**30) -> int:
    """How many cached token positions `free_bytes` of device memory hold beside `reserve_bytes` for
    activations, CUDA graphs and the cuBLAS workspace (an 8B model's 32,768-token passes and graphs ran
    out of memory on an H200 beside 8 GiB): the grid's
    `max_tokens_held` for a model whose KV cache is large (an 8B model's 2,000,000 positions take
    262 GB)."""
    return max(0, int((free_bytes - reserve_bytes) // config.kv_bytes_per_token(dtype_bytes)))


SERVED_BUILT = 64  # shapes whose plans `run_sweep(launch="served")` keeps for reuse


def fake_plan(shape: Shape, block_size: int, vocab: int, rng: np.random.Generator,
              scatter_over: int = 0) -> ScheduledPass:
    """A plan for `shape`: sequences with made-up token ids and block tables laid end to end, or
    (`scatter_over` blocks) drawn at random from that many, as a long-running engine's free list
    hands them out."""
    need = sum(-(-(c + n) // block_size) for c, n in shape.seqs)
    order = rng.choice(scatter_over, need, replace=False).tolist() if scatter_over else list(range(need))
    seqs, block = [], 0
    for i, (c, n) in enumerate(shape.seqs):
        total = c + n
        # only the new tokens are read (the context's keys and values are in the cache already)
        seq = Sequence(f"s{i}", 0.0, total, 1, token_ids=[1] * c + rng.integers(0, vocab, n).tolist())
        blocks = -(-total // block_size)
        seq.block_table = order[block:block + blocks]
        block += blocks
        seq.num_computed = c
        seqs.append(seq)
    new, ctx = [n for _, n in shape.seqs], [c for c, _ in shape.seqs]
    return ScheduledPass(seqs, new, ctx, decode=all(n == 1 for n in new))


def run_sweep(runner: ModelRunner, shapes: list[Shape], repeats: int = 3, seed: int = 0, run_id: str = "sweep",
              progress=None, window: int = 16, scatter: bool = False, fill_std: float = 1.0,
              shuffled: bool = True, launch: str = "windows", warm_up: bool = True,
              in_a_row: int = 1) -> list[PassRecord]:
    """Time every shape `repeats` times, one PassRecord per timed pass (`step` numbering them as
    they ran). One untimed pass of every shape first (compiles, graphs' first replays), then
    `repeats` rounds over all shapes, each round in a new random order, so that a timed pass
    follows some other shape, as in a served workload. The rounds run `window` passes at a time:
    all built on the host first, then launched back to back behind a short untimed lead pass, as
    the engine's overlap runs them, so the times are the GPU's alone (a pass the GPU starts idle
    includes the graph's launch: 0.1-0.4 ms more on the H200's host). With `launch="served"` the
    timed rounds run instead as the serving loop runs passes: each built and launched while the one
    before it runs, one ahead, with no pause between windows (where a busy GPU runs its passes
    slower, the sweep sees it too); a shape met again reuses its plan and batch (the last
    SERVED_BUILT shapes'), so that a designed sequence repeating a few shapes keeps the GPU as
    busy as the engine does: built from scratch, a batch of 256 sequences took the H200's host
    longer than its pass, and the heat run's decode segments of 256 and 512 sequences left the GPU
    idle a third of their time (heat-20261130T071047). `warm_up=False` skips the untimed pass of every shape (for
    shapes the runner has run before: `benchmarks/heat_response.py` times designed sequences).
    `in_a_row` > 1 times each shape of a round that many times back to back (with `launch="served"`
    its batch built once): a shape's passes as a GPU kept busy on it runs them."""
    if launch not in ("windows", "served"):
        raise ValueError(f"launch {launch!r}: windows or served")
    if in_a_row < 1:
        raise ValueError(f"in_a_row must be at least 1, got {in_a_row}")
    cache = runner.cache
    needed = max(blocks_needed(s, cache.block_size) for s in shapes)
    if needed > cache.num_blocks:
        raise ValueError(f"the largest shape needs {needed:,} KV blocks, more than the {cache.num_blocks:,} this cache "
                         f"has; give the sweep more memory or fewer long shapes")
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        cache.storage.normal_(0.0, fill_std)
    runner.clock.zero()
    shuffle = random.Random(seed).shuffle
    order = list(shapes)
    timed = []
    for _ in range(repeats):
        if shuffled:  # (else the rounds keep the given order: a logged run's own, say)
            shuffle(order)
        timed += [shape for shape in order for _ in range(in_a_row)]
    lead = Shape("lead", ((16, 1),))  # one short decode: the pass that waits for the host
    windows = [(order[i:i + window], False) for i in range(0, len(order), window)] if warm_up else []
    if launch == "windows":
        windows += [([lead] + timed[i:i + window], True) for i in range(0, len(timed), window)]
    total = len(shapes) * (repeats * in_a_row + 1)
    vocab = runner.model.config.vocab_size
    scatter_over = cache.num_blocks if scatter else 0
    records: list[PassRecord] = []
    done = index = 0

    def record(passed) -> None:
        nonlocal done
        _, start, end = runner.collect(passed)
        plan = passed.plan
        records.append(PassRecord(run_id=run_id, engine="continuous", step=len(records),
                                  kind=pass_kind(plan.new_tokens, plan.context_lens),
                                  new_tokens=list(plan.new_tokens), context_lens=list(plan.context_lens),
                                  start_s=start, duration_s=end - start, mode=passed.mode, padded_to=passed.padded_to))
        done += 1
        if progress is not None and launch == "served" and done % 64 == 0:
            progress(done, total)
    for batch, timing in windows:
        built = [fake_plan(shape, cache.block_size, vocab, rng, scatter_over) for shape in batch]
        hosts = [build_host_batch(plan, cache.block_size, None) for plan in built]
        launched = []
        for plan, host in zip(built, hosts):
            launched.append(runner.launch(index, plan, host, None, 0.0))
            index += 1
        for i, passed in enumerate(launched):
            if timing and i == 0:
                runner.collect(passed)  # the lead
                continue
            if timing:
                record(passed)
            else:
                runner.collect(passed)
                done += 1
        if progress is not None:
            progress(done, total)
    if launch == "served":  # the lead first, a last one after so that the last timed pass has a successor
        previous = None
        built: dict[Shape, tuple] = {}  # a shape's plan and batch, built once: see the docstring
        for i, shape in enumerate([lead] + timed + [lead]):
            if shape not in built:
                if len(built) >= SERVED_BUILT:
                    built.pop(next(iter(built)))
                plan = fake_plan(shape, cache.block_size, vocab, rng, scatter_over)
                built[shape] = plan, build_host_batch(plan, cache.block_size, None)
            plan, host = built[shape]
            following = runner.launch(index, plan, host, None, 0.0)
            index += 1
            if i == 1:
                runner.collect(previous)  # the lead
            elif i > 1:
                record(previous)
            previous = following
        runner.collect(previous)
        if progress is not None:
            progress(done, total)
    return records
