"""The continuous engine on the CPU: the shared scheduler deciding every pass of the tiny model,
each request's tokens the cached engine's, through preemption, swaps, overlap and every policy."""
import pytest

pytest.importorskip("torch", reason="the engine's tests need the engine extra (torch)")
import torch  # noqa: E402

from core.kv import BlockPool  # noqa: E402
from core.scheduler import ChunkedPrefill, ContinuousBatching, DecodePriority, StaticBatching  # noqa: E402
from engine.continuous import ModelRunner, PassClock, Request, graph_buckets, serve  # noqa: E402
from engine.engines import generate  # noqa: E402
from engine.paged import PagedKVCache  # noqa: E402
from engine.weights import build_random  # noqa: E402

BLOCK = 4


@pytest.fixture(scope="module")
def model():
    return build_random("tiny", dtype="float32", seed=0, std=0.3)


def requests(n=8, gap=0.0):
    lengths = [5, 17, 3, 9, 30, 1, 12, 8, 21, 6][:n]
    outputs = [6, 4, 9, 5, 3, 7, 2, 8, 5, 6][:n]
    return [Request(f"r{i}", i * gap, [(13 * i + 7 * j + 1) % 151000 for j in range(p)], o)
            for i, (p, o) in enumerate(zip(lengths, outputs))]


@pytest.fixture(scope="module")
def reference(model):
    """Each request's tokens from the cached engine, alone."""
    return {r.request_id: generate(model, [r.prompt], r.max_output_tokens, engine="cached").tokens[0]
            for r in requests(10)}


class SteppedClock(PassClock):
    """A CPU run's clock that the engine drives: each reading is 0.1 ms after the last, and a
    sleep moves it on without waiting, so timed arrivals behave the same on any machine."""

    def __init__(self):
        super().__init__(torch.device("cpu"))
        self.t = 0.0

    def zero(self, at=None):
        self.t = 0.0

    def now(self):
        self.t += 1e-4
        return self.t

    def sleep(self, seconds):
        self.t += seconds


def run(model, scheduler, num_blocks, reqs=None, **kw):
    cache = PagedKVCache(model.config, num_blocks, BLOCK, torch.float32, "cpu")
    runner = ModelRunner(model, cache, max_num_seqs=16, kernels=kw.pop("kernels", "eager"))
    realtime = any(r.arrival_s for r in reqs or ())
    if realtime:
        runner.clock = SteppedClock()
    return serve(reqs or requests(), scheduler, runner, realtime=realtime, **kw)


POLICIES = {
    "continuous": lambda kv: ContinuousBatching(kv, max_num_seqs=16, max_model_len=64),
    "chunked": lambda kv: ChunkedPrefill(kv, max_num_seqs=16, max_num_batched_tokens=16, max_model_len=64),
    "static": lambda kv: StaticBatching(kv, batch_size=3, timeout_s=0.0, max_model_len=64),
    "decode-priority": lambda kv: DecodePriority(kv, max_waiting_passes=2, max_num_seqs=16, max_model_len=64),
}


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "sync"])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_policy_gives_each_request_the_cached_engines_tokens(model, reference, policy, overlap):
    res = run(model, POLICIES[policy](BlockPool(200, BLOCK)), 200, overlap=overlap)
    assert not res.interrupted and len(res.requests) == 8
    assert all(r.completed and r.output_tokens == r.max_output_tokens for r in res.requests)
    assert res.tokens == {k: v for k, v in reference.items() if k in res.tokens}
    assert sum(p.num_tokens for p in res.passes) == sum(r.prompt_tokens + r.output_tokens - 1 for r in res.requests)
    for r in res.requests:  # token times are the ends of the passes that produced them
        ends = {round(p.start_s + p.duration_s, 12) for p in res.passes}
        assert all(round(t, 12) in ends for t in r.token_times_s)
        assert r.token_times_s == sorted(r.token_times_s)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "sync"])
@pytest.mark.parametrize("policy", ["continuous", "chunked"])
def test_each_request_records_when_it_was_taken_in_and_when_its_first_pass_started(model, policy, overlap):
    """Requests 20 ms apart (on a clock the engine drives): each is taken in at or after its arrival and before its
    first pass starts; that start is a logged pass's start (with whole prompts, that of the pass
    that ends at its first token)."""
    res = run(model, POLICIES[policy](BlockPool(200, BLOCK)), 200, reqs=requests(5, gap=0.02), overlap=overlap)
    starts = sorted(p.start_s for p in res.passes)
    for r in res.requests:
        assert r.arrival_s <= r.queued_s <= r.scheduled_s <= r.first_token_s
        assert r.scheduled_s in starts
        if policy == "continuous":
            assert any(p.start_s == r.scheduled_s and p.start_s + p.duration_s == r.first_token_s for p in res.passes)


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "sync"])
def test_a_tiny_pool_forces_preemption_and_the_tokens_stay_the_same(model, reference, preemption, overlap):
    kv = BlockPool(14, BLOCK)  # 56 token slots for 8 requests of up to 33 tokens
    sched = ContinuousBatching(kv, max_num_seqs=16, max_model_len=40, preemption=preemption)
    res = run(model, sched, 14, overlap=overlap)
    assert sum(r.preemptions for r in res.requests) > 0
    assert res.tokens == {k: v for k, v in reference.items() if k in res.tokens}
    assert len(res.tokens) == 8


def test_the_triton_kernels_give_the_eager_paths_tokens(model, reference):
    pytest.importorskip("triton")
    if torch.cuda.is_available():  # the tiny model's tensors are on the CPU: Triton's interpreter only
        pytest.skip("the interpreter checks are for machines without a GPU (tests/test_gpu.py runs them there)")
    sched = ChunkedPrefill(BlockPool(200, BLOCK), max_num_seqs=16, max_num_batched_tokens=16, max_model_len=64)
    res = run(model, sched, 200, reqs=requests(5), kernels="triton")
    assert res.tokens == {k: v for k, v in reference.items() if k in res.tokens} and len(res.tokens) == 5
    assert {p.mode for p in res.passes} == {"triton"}


def test_the_graph_paths_static_buffers_give_the_same_tokens(model, reference):
    """Decode passes through the graph path's static buffers and padded buckets (uncaptured on
    the CPU), batch 1 on the fused batch-1 kernels and batches 2 and 4 on the small-batch kernels
    writing into the paged cache (padding rows writing nothing)."""
    pytest.importorskip("triton")
    from test_fast_path import TINY_SMALL, TINY_TILES
    cache = PagedKVCache(model.config, 200, BLOCK, torch.float32, "cpu")
    runner = ModelRunner(model, cache, max_num_seqs=6, kernels="triton", b1_tiles=TINY_TILES, static_decode=True,
                         small_tiles=TINY_SMALL, small_max=16)
    assert runner.fast.fast.uses_small(4)
    for reqs, sched in ((requests(1), ContinuousBatching(BlockPool(200, BLOCK), max_num_seqs=6, max_model_len=64)),
                        (requests(3), ContinuousBatching(BlockPool(200, BLOCK), max_num_seqs=6, max_model_len=64)),
                        (requests(5), ChunkedPrefill(BlockPool(200, BLOCK), max_num_seqs=6, max_num_batched_tokens=16,
                                                     max_model_len=64))):
        res = serve(reqs, sched, runner, realtime=False)
        assert res.tokens == {k: v for k, v in reference.items() if k in res.tokens} and len(res.tokens) == len(reqs)
        assert all(p.mode == "static" and p.padded_to >= (p.batch_size if p.kind == "decode" else p.num_tokens)
                   for p in res.passes)
    assert {p.kind for p in res.passes} == {"prefill", "decode", "mixed"}
    assert {p.padded_to for p in res.passes if p.kind == "decode"} >= {4}  # 3 rows padded to the bucket of 4
    assert {p.padded_to for p in res.passes if p.kind != "decode"} >= {32}  # prompt rows padded to 32


def test_a_request_over_max_model_len_is_rejected_and_the_run_goes_on(model, reference):
    reqs = requests(4) + [Request("long", 0.0, list(range(1, 70)), 5)]
    res = run(model, ContinuousBatching(BlockPool(200, BLOCK), max_model_len=64), 200, reqs=reqs)
    long = next(r for r in res.requests if r.request_id == "long")
    assert long.rejected and "exceeds max_model_len 64" in long.rejected
    assert sum(r.completed for r in res.requests) == 4


def test_pass_records_name_their_shape_and_mode(model):
    res = run(model, ChunkedPrefill(BlockPool(200, BLOCK), max_num_seqs=16, max_num_batched_tokens=16,
                                    max_model_len=64), 200)
    kinds = {p.kind for p in res.passes}
    assert kinds == {"prefill", "decode", "mixed"}
    assert all(p.mode == "eager" and p.padded_to == 0 and p.host_s > 0 and p.duration_s > 0 for p in res.passes)
    assert [p.step for p in res.passes] == list(range(len(res.passes)))


def test_graph_buckets_are_vllms():
    assert graph_buckets(256)[:6] == [1, 2, 4, 8, 16, 24] and graph_buckets(256)[-1] == 256
    assert graph_buckets(20) == [1, 2, 4, 8, 16, 20]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_uploaded_index_arrays_each_start_16_bytes_aligned(dtype):
    """One packed upload, a view per part, each at an aligned address whatever the lengths before
    it (a Triton kernel compiles a variant per pointer alignment), each holding its own values."""
    import numpy as np

    from engine.host_buffers import Uploads
    parts = [np.arange(n, dtype=np.int64) * (i + 1) for i, n in enumerate((3, 1, 7, 0, 5, 2))]
    views = Uploads(torch.device("cpu"), dtype).upload(parts)
    assert [v.tolist() for v in views] == [p.tolist() for p in parts]
    assert all(v.data_ptr() % 16 == 0 for v in views)
    assert all(v.dtype == dtype for v in views)


def test_records_are_written_while_the_engine_waits_for_arrivals(model, tmp_path):
    """Requests 60 ms apart (on a clock the engine drives, so on any machine): between them the engine is idle, and the records of the requests
    done so far are written then (not in the middle of a pass); all are there at the end."""
    from core.kv import BlockPool
    from core.runstore import OpenRunWriter, RunStore

    writer = OpenRunWriter(RunStore(tmp_path), "run")
    written_during_run = []

    def while_waiting(busy):
        writer.write_while(busy)
        written_during_run.append((writer.dir / "requests.jsonl").read_text().count("\n"))

    reqs = requests(3, gap=0.06)
    cache = PagedKVCache(model.config, 64, BLOCK, torch.float32, "cpu")
    runner = ModelRunner(model, cache, max_num_seqs=16, kernels="eager")
    runner.clock = SteppedClock()
    res = serve(reqs, ContinuousBatching(BlockPool(64, BLOCK), max_num_seqs=16, max_model_len=64), runner,
                realtime=True, on_request=writer.request, on_pass=writer.pass_done, while_waiting=while_waiting)
    writer.close()
    assert max(written_during_run) >= 1  # a finished request's record written before the run ended
    assert len(RunStore(tmp_path).passes("run")) == len(res.passes)
