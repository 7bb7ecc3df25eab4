"""The sweep's order: every shape timed `repeats` times, each timed pass after some other shape."""
import pytest

pytest.importorskip("torch", reason="the sweep runs the engine")
import torch  # noqa: E402

from calibrate.sweep import MIXTURE_BATCHES, Shape, default_shapes, mixture_shapes, run_sweep  # noqa: E402
from engine.continuous import ModelRunner  # noqa: E402
from engine.paged import PagedKVCache  # noqa: E402
from engine.weights import build_random  # noqa: E402


def tiny_runner() -> ModelRunner:
    """The tiny model's runner on the CPU: 64 KV blocks of 16, batches of up to 4, eager kernels."""
    model = build_random("tiny", dtype="float32", seed=0)
    return ModelRunner(model, PagedKVCache(model.config, 64, 16, torch.float32, "cpu"), 4, "eager")


def test_rounds_interleave_the_shapes_and_time_each_one_repeats_times():
    runner = tiny_runner()
    shapes = [Shape(f"s{i}", seqs) for i, seqs in
              enumerate((((8, 1),), ((20, 1), (3, 1)), ((0, 12),), ((5, 7), (30, 1)), ((0, 3), (0, 5))))]
    records = run_sweep(runner, shapes, repeats=3, seed=1)
    seen = [tuple(zip(p.context_lens, p.new_tokens)) for p in records]
    assert sorted(seen) == sorted([s.seqs for s in shapes] * 3)
    assert [p.step for p in records] == list(range(15))
    rounds = [seen[i:i + 5] for i in range(0, 15, 5)]
    assert all(sorted(r) == sorted(s.seqs for s in shapes) for r in rounds)  # each round has every shape once
    assert len({tuple(r) for r in rounds}) > 1  # in a new order


def test_the_grid_has_batches_like_served_workloads():
    groups = [s.group for s in default_shapes(256, 16384)]
    assert "decode b32 seed" in groups and "decode b256 tail" in groups
    mixed_prompts = [s for s in default_shapes(256, 16384) if s.group.startswith("prompts") and "mixed" in s.group]
    assert mixed_prompts and all(sum(n for _, n in s.seqs) <= 32768 and len({n for _, n in s.seqs}) > 1
                                 for s in mixed_prompts)


def test_the_grid_has_prompt_passes_a_cuda_graph_runs_padded():
    from engine.buckets import PREFILL_GRAPH_TOKENS, powers_of_two
    buckets = powers_of_two(32, PREFILL_GRAPH_TOKENS)  # the prefill graphs' token counts
    padded = [s for s in default_shapes(1024, 16384) if s.group.startswith("prompts seed")
              and sum(n for _, n in s.seqs) <= buckets[-1] and sum(n for _, n in s.seqs) not in buckets]
    # the part0 workload's prompts in twos to fives, as a loaded engine groups them: 4,096 + 64 tokens run at 8,192
    assert {len(s.seqs) for s in padded} == {2, 3, 4, 5} and len(padded) >= 15
    assert any(s.seqs == ((0, 4096), (0, 64)) for s in padded)


def test_rounds_can_keep_the_given_order():
    runner = tiny_runner()
    shapes = [Shape(f"s{i}", ((8 + i, 1),)) for i in range(20)]
    records = run_sweep(runner, shapes, repeats=2, shuffled=False)
    assert [p.context_lens[0] for p in records] == [8 + i for i in range(20)] * 2


@pytest.mark.parametrize("launch", ["windows", "served"])
def test_both_ways_of_launching_time_every_shape_in_the_rounds_order(launch):
    runner = tiny_runner()
    shapes = [Shape(f"s{i}", ((8 + i, 1),)) for i in range(20)]
    seen = []
    records = run_sweep(runner, shapes, repeats=2, shuffled=False, launch=launch,
                        progress=lambda done, total: seen.append((done, total)))
    assert [p.context_lens[0] for p in records] == [8 + i for i in range(20)] * 2  # no lead among them
    assert [p.step for p in records] == list(range(40))
    assert all(p.duration_s > 0 for p in records)
    assert all(b.start_s >= a.start_s + a.duration_s for a, b in zip(records, records[1:]))
    assert seen[-1] == (60, 60)  # every shape's warm-up pass and its two timed ones


def test_an_unknown_way_of_launching_is_refused():
    runner = tiny_runner()
    with pytest.raises(ValueError, match="windows or served"):
        run_sweep(runner, [Shape("s", ((8, 1),))], launch="batched")


def test_the_grid_has_closed_batches_single_passes_up_to_its_token_limit():
    passes = {s.group: sum(n for _, n in s.seqs) for s in default_shapes(1024, 16384, max_pass_tokens=262_144)}
    assert passes["prompts mix x192"] == 192 // 5 * sum((16, 64, 256, 1024, 4096)) + 16 + 64  # the part0 workload's five in turn
    assert max(passes.values()) == 262_144
    assert max(sum(n for _, n in s.seqs) for s in default_shapes(1024, 16384, max_pass_tokens=65_536)) == 65_536
    assert max(sum(n for _, n in s.seqs) for s in default_shapes(1024, 16384)) == 32_768  # the default


def test_served_launches_build_a_repeated_shape_once(monkeypatch):
    """A designed sequence repeats a few shapes: served launches reuse their plans and batches, so
    the host does not rebuild (and the GPU wait for) a batch it has built before."""
    import calibrate.sweep as sweep

    runner = tiny_runner()
    built = []
    real = sweep.fake_plan
    monkeypatch.setattr(sweep, "fake_plan", lambda shape, *a, **k: built.append(shape.group) or real(shape, *a, **k))
    a, b = Shape("a", ((8, 1), (9, 1))), Shape("b", ((0, 12),))
    records = run_sweep(runner, [a, b, a, a, b], repeats=1, shuffled=False, launch="served", warm_up=False)
    assert [r.context_lens for r in records] == [[8, 9], [0], [8, 9], [8, 9], [0]]
    assert sorted(built) == ["a", "b", "lead"]


def test_the_mixtures_grid_sets_each_spread_batch_beside_its_twin_of_one_context():
    shapes = mixture_shapes(max_batch=128, max_context=8192)
    assert {len(s.seqs) for s in shapes} == {b for b in MIXTURE_BATCHES if b <= 128}
    by_group = {s.group: s for s in shapes}
    spread = [s for s in shapes if not s.group.endswith("twin")]
    assert len(spread) == len(shapes) // 2
    for s in spread:
        twin = by_group[s.group + " twin"]
        contexts = [c for c, _ in s.seqs]
        assert all(n == 1 for _, n in s.seqs + twin.seqs)  # decode passes
        assert len(twin.seqs) == len(s.seqs) and {c for c, _ in twin.seqs} == {round(sum(contexts) / len(contexts))}
        assert max(contexts) <= 8000 and max(contexts) > 2 * min(contexts)  # spread, within the cap
    assert mixture_shapes(max_batch=32) == []


def test_a_mixtures_sweep_is_not_the_sweep_fit_reads(tmp_path, capsys):
    from calibrate.__main__ import main
    assert main(["sweep", "--grid", "mixtures", "--repeats", "1", "--max-batch", "40", "--max-context", "128",
                 "--out", str(tmp_path)]) == 0
    assert main(["fit", "--results", str(tmp_path), "--no-charts"]) == 2
    assert "no sweep under" in capsys.readouterr().err
    assert main(["sweep", "--grid", "mixtures", "--max-batch", "8", "--out", str(tmp_path)]) == 2
    assert "--grid mixtures times batches of 40 sequences and more; --max-batch is 8" in capsys.readouterr().err


def test_the_mixed_grid_holds_served_mixed_passes_and_the_default_grids_own():
    from calibrate.sweep import MIXED_BUDGETS, default_shapes, mixed_shapes
    shapes = mixed_shapes(1024, 16384, seed=0)
    own = [s for s in default_shapes(1024, 16384, seed=0) if s.group.startswith("mixed ")]
    assert shapes[:len(own)] == own  # the calibration sweep's mixed passes, to set cards side by side
    served = shapes[len(own):]
    assert served and all(s.group.startswith("mixed served") for s in served)
    for s in served:
        decodes = [c for c, n in s.seqs if n == 1]
        chunks = [(c, n) for c, n in s.seqs if n > 1]
        assert sum(n for _, n in s.seqs) in MIXED_BUDGETS and 16 <= len(decodes) <= 256 and 1 <= len(chunks) <= 3
        assert all(16 <= c <= 8000 for c in decodes) and all(c == 0 for c, _ in chunks[1:])
    assert max(len([1 for _, n in s.seqs if n == 1]) for s in served) == 256


def test_a_mixed_sweep_runs_on_the_cpu_and_is_not_the_sweep_fit_reads(tmp_path, capsys):
    from calibrate.__main__ import main
    from core.runstore import RunStore
    assert main(["sweep", "--grid", "mixed", "--repeats", "1", "--max-batch", "20", "--max-context", "256",
                 "--out", str(tmp_path)]) == 0
    rows = RunStore(tmp_path / "calibration").rows()
    assert [r["kind"] for r in rows] == ["sweep-mixed"]
    passes = RunStore(tmp_path / "calibration").passes(rows[0]["run_id"])
    assert passes and all(p.kind == "mixed" and len(p.new_tokens) <= 20 for p in passes)
    assert any(len(p.new_tokens) > 16 for p in passes)  # served ones: 16 decodes beside their chunks
    assert main(["fit", "--results", str(tmp_path), "--no-charts"]) == 2
    assert "no sweep under" in capsys.readouterr().err


@pytest.mark.parametrize("launch", ["windows", "served"])
def test_in_a_row_times_each_shape_of_a_round_that_many_times_back_to_back(launch):
    runner = tiny_runner()
    shapes = [Shape(f"s{i}", ((8 + i, 1),)) for i in range(5)]
    seen = []
    records = run_sweep(runner, shapes, repeats=2, seed=3, launch=launch, in_a_row=3,
                        progress=lambda done, total: seen.append((done, total)))
    contexts = [p.context_lens[0] for p in records]
    assert len(contexts) == 5 * 2 * 3
    runs = [contexts[i:i + 3] for i in range(0, len(contexts), 3)]
    assert all(len(set(run)) == 1 for run in runs)  # each shape three times in a row
    assert sorted(run[0] for run in runs) == sorted([8 + i for i in range(5)] * 2)  # every shape in both rounds
    assert seen[-1] == (35, 35)  # every shape's warm-up pass and its six timed ones
    with pytest.raises(ValueError, match="in_a_row must be at least 1"):
        run_sweep(runner, shapes, in_a_row=0)


def test_an_in_a_row_sweep_is_not_the_sweep_fit_reads(tmp_path, capsys):
    from calibrate.__main__ import main
    from core.runstore import RunStore
    assert main(["sweep", "--in-a-row", "2", "--launch", "served", "--repeats", "1", "--max-batch", "4",
                 "--max-context", "64", "--out", str(tmp_path)]) == 0
    rows = RunStore(tmp_path / "calibration").rows()
    assert [(r["kind"], r["in_a_row"], r["launch"]) for r in rows] == [("sweep-in-a-row", 2, "served")]
    assert len(RunStore(tmp_path / "calibration").passes(rows[0]["run_id"])) == 2 * rows[0]["shapes"]
    assert main(["fit", "--results", str(tmp_path), "--no-charts"]) == 2
    assert "no sweep under" in capsys.readouterr().err
