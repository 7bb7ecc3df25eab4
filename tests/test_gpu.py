"""On a GPU: the CUDA-graph path gives the tokens of the eager paths. Skipped without CUDA."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

from engine.engines import generate  # noqa: E402
from engine.prompts import prompt_ids  # noqa: E402
from engine.weights import build_random  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return build_random("qwen2.5-1.5b", dtype="float16", device="cuda", seed=0)


def _first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


@pytest.mark.parametrize("batch", [1, 3])
def test_graph_replay_gives_the_tokens_of_the_same_kernels_launched_eagerly(model, batch):
    from engine.cuda_graphs import GraphDecoder

    prompts = [prompt_ids("p256")] * batch
    graphs = generate(model, prompts, 256, engine="batched", decoder=GraphDecoder(model, True)).tokens
    launched = generate(model, prompts, 256, engine="batched", decoder=GraphDecoder(model, False)).tokens
    assert graphs == launched


@pytest.mark.parametrize("prompt, batch", [("p256", 1), ("p64", 4), ("p1024", 1)])
def test_graph_path_gives_the_eager_pytorch_models_tokens(model, prompt, batch):
    from engine.cuda_graphs import GraphDecoder

    prompts = [prompt_ids(prompt)] * batch
    eager = generate(model, prompts, 256, engine="batched").tokens
    graphs = generate(model, prompts, 256, engine="batched", decoder=GraphDecoder(model)).tokens
    assert len(set(eager[0])) > 10, "degenerate output would hide differences"
    for e, g in zip(eager, graphs):
        assert e == g, f"first difference at token {_first_difference(e, g)}"


def test_graph_path_handles_a_batch_of_different_prompts(model):
    from engine.cuda_graphs import GraphDecoder

    ids = prompt_ids("p1024")
    prompts = [ids[:100], ids[200:456], ids[500:517]]
    eager = generate(model, prompts, 64, engine="batched").tokens
    alone = [generate(model, [p], 64, engine="cached", decoder=GraphDecoder(model)).tokens[0] for p in prompts]
    together = generate(model, prompts, 64, engine="batched", decoder=GraphDecoder(model)).tokens
    assert together == alone == eager
