"""Decode attention as its programs run (`sim.schedule`): the makespan of programs sharing the KV
bandwidth, against a plain simulation of every program, and the cost model that prices batches
that fill the GPU by it."""
import json

import numpy as np
import pytest

from sim.calibrated import bucket
from sim.cost import CalibratedCost
from sim.schedule import makespan, program_runs
from test_sim_cost import calibration


def one_by_one(blocks: list[int], bandwidth: float, block_s: float, start_s: float, resident: int) -> float:
    """The same schedule, program by program: at each step the running programs all walk until the
    first of them ends."""
    work = [b + start_s / block_s for b in blocks if b]
    running, k, clock = [], 0, 0.0
    while k < len(work) and len(running) < resident:
        running.append(work[k])
        k += 1
    while running:
        pace = min(1.0 / block_s, bandwidth / len(running))
        step = min(running)
        clock += step / pace
        running = [w - step for w in running]
        ended = sum(1 for w in running if w <= 1e-12)
        running = [w for w in running if w > 1e-12]
        for _ in range(ended):
            if k < len(work):
                running.append(work[k])
                k += 1
    return clock


def test_the_makespan_is_the_schedule_walked_program_by_program():
    rng = np.random.default_rng(0)
    for _ in range(40):
        blocks = rng.integers(0, 17, int(rng.integers(1, 400))).tolist()
        runs = [(b, 1) for b in blocks]
        args = (float(rng.uniform(5, 200)), float(rng.uniform(0.5, 3)), float(rng.uniform(0, 2)), int(rng.integers(1, 64)))
        assert makespan(runs, *args) == pytest.approx(one_by_one(blocks, *args), rel=1e-9)


def test_many_programs_are_bandwidth_bound_and_one_alone_latency_bound():
    # 1,000 programs of 16 blocks over 100 resident sharing 10 blocks a second: the blocks' read
    assert makespan([(16, 1000)], 10.0, 0.5, 0.0, 100) == pytest.approx(1600.0)
    # one program: its blocks at its own pace, its start beside them
    assert makespan([(16, 1)], 10.0, 0.5, 2.0, 100) == pytest.approx(16 * 0.5 + 2.0)
    # a tail: 99 short programs and one long one launched last walk at the bandwidth, then it alone
    t = makespan([(1, 99), (16, 1)], 10.0, 0.5, 0.0, 100)
    assert t > (99 + 16) / 10.0 and t == pytest.approx(one_by_one([1] * 99 + [16], 10.0, 0.5, 0.0, 100))


def test_programs_launch_slice_by_slice_for_every_head():
    # slices of 4 positions, blocks of 2: contexts of 3, 9 and 4 positions
    runs = program_runs([3, 9, 4], [4, 4, 4], 2, 2)
    # slice 0: 2, 2, 2 blocks (x2 heads); slice 1: the 9's 2 blocks (x2); slice 2: its last position (x2)
    assert runs == [(2, 3), (2, 3), (2, 1), (2, 1), (1, 1), (1, 1)]
    assert program_runs([], [], 2, 2) == []


def programs_one_by_one(lengths, slice_lens, block_n, kv_heads):
    """The launch order walked program by program, then merged into runs."""
    flat = []
    for k in range(max((-(-n // s) for n, s in zip(lengths, slice_lens)), default=0)):
        row = [-(-min(s, n - k * s) // block_n) for n, s in zip(lengths, slice_lens) if k * s < n]
        flat.extend(row * kv_heads)
    runs = []
    for b in flat:
        if runs and runs[-1][0] == b:
            runs[-1][1] += 1
        else:
            runs.append([b, 1])
    return runs


def test_program_runs_are_the_programs_in_launch_order():
    cost = scheduled()
    rng = np.random.default_rng(1)
    for _ in range(30):
        lengths = rng.integers(1, 20000, int(rng.integers(1, 300)))
        if rng.random() < 0.3:
            lengths[:] = lengths[0] + rng.integers(0, 3, len(lengths))  # long runs of equal programs
        B = bucket(len(lengths), cost.buckets)
        sl = cost.slice_lens(lengths, B)
        assert sl.tolist() == [cost.slice_of(int(n), B)[0] for n in lengths]
        runs = program_runs(lengths, sl, cost.block_n, cost.kv_heads)
        merged = []  # (runs end where a head's row ends; merging them again gives the flat order's runs)
        for b, c in runs:
            if merged and merged[-1][0] == b:
                merged[-1][1] += c
            else:
                merged.append([b, c])
        assert merged == programs_one_by_one(lengths.tolist(), sl.tolist(), cost.block_n, cost.kv_heads)
        assert all(type(b) is int and type(c) is int for b, c in runs)


def scheduled(**rates) -> CalibratedCost:
    d = calibration(graph_buckets=[1, 2, 4, 8, 16, 24, 32, 64])
    d["parameters"]["decode"]["schedule"] = {"kv_gbs": 4500.0, "block_s": 6e-5, "start_s": 4e-5, **rates}
    d["parameters"]["decode"]["graph_s"]["64"] = 2.0e-3
    return CalibratedCost(d)


def test_a_schedule_prices_full_batches_by_their_programs_and_leaves_small_ones_to_the_form():
    cost, plain = scheduled(), CalibratedCost(calibration(graph_buckets=[1, 2, 4, 8, 16, 24, 32, 64]))
    ctx = [100] * 60 + [5000] * 4  # 64 sequences: fills the GPU (fills_gpu 128, 2 KV heads)
    lengths = np.array(ctx) + 1
    runs = program_runs(lengths, cost.slice_lens(lengths, bucket(len(lengths), cost.buckets)), cost.block_n, cost.kv_heads)
    attention = makespan(runs, 4500e9 / cost.block_bytes, 6e-5, 4e-5, cost.decode_wave)
    assert cost.pass_time([1] * 64, ctx) == pytest.approx(cost.graph_time(64) + attention, rel=1e-12)
    assert cost.decode_line(64, sum(ctx), max(ctx)) is None  # stepped pass by pass
    assert cost.pass_time([1] * 8, ctx[-8:]) == plain.pass_time([1] * 8, ctx[-8:])  # the small slicing: the form
    assert cost.decode_line(8, sum(ctx[-8:]), max(ctx[-8:])) == plain.decode_line(8, sum(ctx[-8:]), max(ctx[-8:]))
    # spread contexts cost more than one context of their mean, as the schedule's tail says
    mean = [sum(ctx) // 64] * 64
    assert cost.pass_time([1] * 64, ctx) > cost.pass_time([1] * 64, mean)


@pytest.mark.parametrize("bad, message", [({"kv_gbs": 0.0}, "needs kv_gbs and block_s above 0"),
                                          ({"block_s": -1.0}, "decode.schedule.block_s must be a finite number")])
def test_a_broken_schedule_is_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        scheduled(**bad)
    d = calibration()
    d["parameters"]["decode"]["schedule"] = [1, 2, 3]
    with pytest.raises(ValueError, match="decode.schedule must be an object"):
        CalibratedCost(json.loads(json.dumps(d)))


def test_the_chunk_kernels_tiles_launch_last_first_and_head_by_head():
    from sim.schedule import chunk_tile_runs
    # tiles of 4 tokens, blocks of 8 positions: a decode on 20 cached, a chunk of 10 on 6 cached
    runs = chunk_tile_runs([1, 10], [20, 6], 4, 8, 2)
    # the decode: ceil(21 / 8) = 3 blocks; the chunk's tiles, last first: to 16, 14 and 10 positions
    assert runs == [(3, 1), (2, 3)] * 2


def mixed_cost(**rates) -> CalibratedCost:
    d = calibration()
    d["parameters"]["mixed"] = {"fixed_s": 9e-4, "weight_gbs": 5000.0, "matmul_tflops": 800.0, "per_seq_s": 4e-6,
                                "block_s": 5e-5, "start_s": 1e-4, **rates}
    return CalibratedCost(json.loads(json.dumps(d)))


def test_a_mixed_form_prices_mixed_passes_by_their_tiles_and_leaves_the_rest():
    from sim.schedule import chunk_tile_runs
    cost, plain = mixed_cost(), CalibratedCost(calibration())
    new, ctx = [1] * 40 + [300], [900] * 20 + [3000] * 20 + [0]
    q = cost.mixed
    tiles = makespan(chunk_tile_runs(new, ctx, cost.tile_tokens, cost.block_n, cost.kv_heads), float("inf"),
                     q["block_s"], q["start_s"], cost.prefill_wave)
    m = 512  # 340 tokens, padded to the graph's
    expected = (q["fixed_s"] + max(cost.weight_bytes / 5000e9, m * cost.flops_per_token / 800e12) + tiles + 41 * 4e-6)
    assert cost.pass_time(new, ctx) == pytest.approx(expected, rel=1e-12)
    # the longest decode's walk bounds it: 3,001 positions are 47 blocks, a start beside them
    assert tiles >= 47 * 5e-5 + 1e-4
    assert cost.pass_time([300], [0]) == plain.pass_time([300], [0])  # prompts: the waves
    assert cost.pass_time([1] * 8, [900] * 8) == plain.pass_time([1] * 8, [900] * 8)  # decodes: their form
    eager = [1] * 4 + [2000]  # past the largest token bucket (1,024): no graph, the waves
    assert cost.pass_time(eager, [900] * 4 + [0]) == plain.pass_time(eager, [900] * 4 + [0])
    # projected to another card: arithmetic by the arithmetic ratio, as the waves' chunk attention
    from sim.cost import gpu_preset
    _, h200 = gpu_preset("NVIDIA H200")
    _, a10 = gpu_preset("NVIDIA A10")
    moved = cost.projected(a10, h200)
    assert moved.mixed["block_s"] == pytest.approx(q["block_s"] * h200.fp16_tflops / a10.fp16_tflops)


def test_a_broken_mixed_form_is_refused():
    with pytest.raises(ValueError, match="parameters.mixed.block_s must be above 0"):
        mixed_cost(block_s=0.0)
    with pytest.raises(ValueError, match="mixed.start_s must be a finite number"):
        mixed_cost(start_s=-1.0)
