"""The three engines on the tiny model, on the CPU."""
import pytest
pytest.importorskip("torch", reason="the engine's tests need the engine extra (torch)")
from dataclasses import replace


from engine.engines import generate
from engine.weights import build_random

PROMPTS = [[(7 * i + 3) % 151000 for i in range(n)] for n in (5, 11, 8, 11)]


@pytest.fixture(scope="module")
def model():
    return build_random("tiny", dtype="float32", seed=0, std=0.3)


def test_naive_cached_and_batched_produce_identical_tokens(model):
    prompt = PROMPTS[1]
    naive = generate(model, [prompt], 24, engine="naive").tokens
    cached = generate(model, [prompt], 24, engine="cached").tokens
    batched = generate(model, [prompt], 24, engine="batched").tokens
    assert naive == cached == batched
    assert len(set(naive[0])) > 3  # a model that repeats one token would hide bugs


def test_batch_of_different_prompts_gives_each_the_tokens_it_gets_alone(model):
    alone = [generate(model, [p], 20, engine="cached").tokens[0] for p in PROMPTS]
    together = generate(model, PROMPTS, 20, engine="batched").tokens
    assert together == alone


def test_naive_engine_handles_a_batch_of_different_lengths(model):
    alone = [generate(model, [p], 6, engine="cached").tokens[0] for p in PROMPTS]
    assert generate(model, PROMPTS, 6, engine="naive").tokens == alone


def test_every_pass_is_logged_with_its_shape_and_time(model):
    run = generate(model, PROMPTS[:2], 5, engine="batched", run_id="r1")
    assert len(run.passes) == 5
    prefill, *decodes = run.passes
    assert prefill.kind == "prefill" and prefill.new_tokens == [5, 11] and prefill.context_lens == [0, 0]
    assert [p.kind for p in decodes] == ["decode"] * 4
    assert decodes[0].new_tokens == [1, 1] and decodes[0].context_lens == [5, 11]
    assert decodes[-1].context_lens == [8, 14]
    assert all(p.duration_s > 0 and p.run_id == "r1" and p.engine == "batched" for p in run.passes)
    starts = [p.start_s for p in run.passes]
    assert starts == sorted(starts)
    assert run.step_times_s == sorted(run.step_times_s)


def test_naive_passes_recompute_the_whole_sequence(model):
    run = generate(model, [PROMPTS[0]], 4, engine="naive")
    assert [p.new_tokens for p in run.passes] == [[5], [6], [7], [8]]
    assert all(p.kind == "prefill" and p.context_lens == [0] for p in run.passes)


def test_request_records_carry_token_times(model):
    run = generate(model, PROMPTS[:2], 6, engine="batched")
    records = run.request_records("r")
    assert [r.output_tokens for r in records] == [6, 6]
    assert records[0].first_token_s == run.step_times_s[0] and records[0].finish_s == run.step_times_s[-1]
    assert records[1].prompt_tokens == 11 and records[1].itl_count == 5


def test_stop_at_eos_ends_each_request_at_its_eos(model):
    free = generate(model, [PROMPTS[0]], 12, engine="cached").tokens[0]
    eos = free[4]
    original = model.config  # a frozen dataclass: swap in one whose EOS is a token we know comes

    model.config = replace(original, eos_token_id=eos)
    try:
        run = generate(model, [PROMPTS[0]], 12, engine="cached", stop_at_eos=True)
    finally:
        model.config = original
    first = free.index(eos)
    assert run.request_records()[0].output_tokens == first + 1
    assert len(run.passes) == first + 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(engine="fast"), "unknown engine 'fast'"),
    (dict(max_new_tokens=0), "max_new_tokens must be >= 1"),
    (dict(max_new_tokens=9000), "exceeds the model's context of 8192"),
])
def test_bad_requests_are_named(model, kwargs, message):
    args = dict(engine="cached", max_new_tokens=4) | kwargs
    with pytest.raises(ValueError, match=message):
        generate(model, [PROMPTS[0]], **args)


def test_cached_engine_refuses_a_batch(model):
    with pytest.raises(ValueError, match="one prompt at a time"):
        generate(model, PROMPTS, 4, engine="cached")


def test_fp16_runs_on_cpu_and_agrees_with_fp32_on_the_first_tokens(model):
    half = build_random("tiny", dtype="float16", seed=0, std=0.3)
    a = generate(model, [PROMPTS[1]], 3, engine="cached").tokens
    b = generate(half, [PROMPTS[1]], 3, engine="cached").tokens
    assert a == b
