"""Each family the engine runs (Qwen2, Llama 3 with llama3 rope scaling, Qwen3, Mistral), written
by Hugging Face's own classes and loaded here: the same logits as transformers, through the
eager model, the paged engine's eager pass and the fused kernels (Triton's interpreter on a CPU)."""
import pytest
pytest.importorskip("torch", reason="the engine's tests need the engine extra (torch)")
import json

import torch

transformers = pytest.importorskip("transformers")

from core.config import ModelConfig  # noqa: E402
from engine.model import DenseKVCache  # noqa: E402
from engine.weights import CheckpointError, engine_to_hf, load_checkpoint, load_model  # noqa: E402

VOCAB = 512
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
# original_max_position_embeddings 32: the prompts below reach positions where llama3 scaling bites
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32, "rope_theta": 500000.0}
FAMILIES = {
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(tie_word_embeddings=True)),
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              dict(tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE)),
    # head_dim 32 with 4 heads over hidden 64: q is 128 wide
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(head_dim=32, tie_word_embeddings=False)),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM,
                dict(sliding_window=None, tie_word_embeddings=False)),
}


def relative_error(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def hf_model(family: str, seed: int = 0):
    config_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**COMMON, **extra)).eval()
    with torch.no_grad():  # biases start at zero and norms at one; make them count
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.fixture(scope="module", params=list(FAMILIES))
def checkpoint(request, tmp_path_factory):
    model = hf_model(request.param)
    path = tmp_path_factory.mktemp(request.param)
    # one family sharded, as large checkpoints are on the Hub
    model.save_pretrained(path, **({"max_shard_size": "100KB"} if request.param == "llama" else {}))
    return request.param, path, model


def test_the_config_reads_as_the_family(checkpoint):
    family, path, _ = checkpoint
    c = ModelConfig.from_json(path)
    assert c.model_type == family
    assert c.attention_bias == (family == "qwen2") and c.qk_norm == (family == "qwen3")
    assert c.head_dim == (32 if family == "qwen3" else 16)
    assert (c.rope_scaling is not None) == (family == "llama")
    if family == "llama":
        assert (path / "model.safetensors.index.json").exists()


def test_logits_match_transformers_for_prefill_and_cached_decode(checkpoint):
    family, path, hf = checkpoint
    model = load_checkpoint(path, dtype="float32")
    prompt = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hf_out = hf(prompt, use_cache=True)
        cache = DenseKVCache(model.config, 1, 64, torch.float32, "cpu")
        ours = model.logits(model(prompt, torch.arange(40).unsqueeze(0), cache))
        assert relative_error(ours, hf_out.logits) < 1e-4
        past, token = hf_out.past_key_values, hf_out.logits[:, -1].argmax(-1, keepdim=True)
        for step in range(6):
            hf_out = hf(token, past_key_values=past, use_cache=True)
            past = hf_out.past_key_values
            ours = model.logits(model(token, torch.tensor([[40 + step]]), cache))
            assert relative_error(ours, hf_out.logits) < 1e-4, f"{family} decode step {step}"
            token = hf_out.logits[:, -1].argmax(-1, keepdim=True)


def test_weights_round_trip_through_hugging_face_names(checkpoint):
    family, path, hf = checkpoint
    model = load_checkpoint(path, dtype="float32")
    theirs = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight" or not model.config.tie_word_embeddings}
    ours = engine_to_hf(model)
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name


def test_the_fused_kernels_give_the_eager_tokens(checkpoint):
    """Batch 1 (the fused projection kernel, zero bias for the families without one, Qwen3's
    q/k norm unfused), batched decode and prefill, against the eager model's tokens."""
    if torch.cuda.is_available():
        pytest.skip("tests/test_gpu.py runs these on the GPU")
    pytest.importorskip("triton")
    from engine.cuda_graphs import GraphDecoder
    from engine.engines import generate
    family, path, _ = checkpoint
    model = load_checkpoint(path, dtype="float32")
    tiles = {"qkv": (8, 64, 4), "o": (8, 64, 4), "gate_up": (16, 64, 4), "down": (8, 128, 4), "lm_head": (64, 64, 4)}
    one = [[(7 * i + 3) % VOCAB for i in range(10)]]
    assert generate(model, one, 5, engine="cached", decoder=GraphDecoder(model, False, tiles)).tokens == \
        generate(model, one, 5, engine="cached").tokens
    two = [[(5 * i + b) % VOCAB for i in range(9)] for b in range(2)]
    assert generate(model, two, 4, engine="batched", decoder=GraphDecoder(model, False, tiles)).tokens == \
        generate(model, two, 4, engine="batched").tokens


def test_the_continuous_engine_gives_the_cached_engines_tokens(checkpoint):
    """The paged cache, chunked prefill and batched decode, in plain PyTorch (the fused paged
    passes of each family run in tests/test_gpu.py)."""
    from core.kv import BlockPool
    from core.scheduler import ChunkedPrefill
    from engine.continuous import ModelRunner, Request, serve
    from engine.engines import generate
    from engine.paged import PagedKVCache
    family, path, _ = checkpoint
    model = load_checkpoint(path, dtype="float32")
    reqs = [Request(f"r{i}", 0.0, [(13 * i + 7 * j + 1) % VOCAB for j in range(n)], o)
            for i, (n, o) in enumerate([(5, 4), (17, 3), (9, 5)])]
    reference = {r.request_id: generate(model, [r.prompt], r.max_output_tokens, engine="cached").tokens[0]
                 for r in reqs}
    block = 4
    cache = PagedKVCache(model.config, 64, block, torch.float32, "cpu")
    runner = ModelRunner(model, cache, max_num_seqs=4, kernels="eager")
    sched = ChunkedPrefill(BlockPool(64, block), max_num_seqs=4, max_num_batched_tokens=8, max_model_len=64)
    res = serve(reqs, sched, runner, realtime=False)
    assert res.tokens == reference


def _write(path, hf_dict: dict, tensors: dict):
    from safetensors.torch import save_file
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf_dict))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))


def test_a_missing_or_mis_shaped_tensor_is_named(checkpoint, tmp_path):
    family, path, hf = checkpoint
    config = json.loads((path / "config.json").read_text())
    tensors = {k: v.clone() for k, v in hf.state_dict().items()}
    if config.get("tie_word_embeddings"):
        tensors.pop("lm_head.weight", None)
    name = "model.layers.1.self_attn.k_norm.weight" if family == "qwen3" else "model.layers.1.self_attn.k_proj.weight"
    wrong = dict(tensors, **{name: torch.zeros(3, *tensors[name].shape[1:])})
    _write(tmp_path / "bad", config, wrong)
    with pytest.raises(CheckpointError, match=rf"{name}: \(3,.*expected \({tensors[name].shape[0]},"):
        load_checkpoint(tmp_path / "bad")
    if family != "qwen2":  # a bias the config does not give the model: another model's checkpoint
        _write(tmp_path / "bias", config, dict(tensors, **{"model.layers.0.self_attn.q_proj.bias": torch.zeros(3)}))
        with pytest.raises(CheckpointError, match=r"tensor model.layers.0.self_attn.q_proj.bias is not in a"):
            load_checkpoint(tmp_path / "bias")
    missing = "lm_head.weight" if not config.get("tie_word_embeddings") else "model.layers.0.mlp.up_proj.weight"
    _write(tmp_path / "missing", config, {k: v for k, v in tensors.items() if k != missing})
    with pytest.raises(CheckpointError, match=f"missing tensors {missing}"):
        load_checkpoint(tmp_path / "missing")


def test_a_config_json_alone_gives_random_weights_of_its_shape(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(hf_model("qwen3").config.to_dict()))
    model, weights = load_model(str(cfg), dtype="float32")
    assert weights == "random" and model.config.qk_norm and model.layers[0].self_attn.q_norm.weight.shape == (32,)


def test_a_checkpoint_of_an_unsupported_architecture_is_refused_in_one_line(tmp_path):
    d = dict(COMMON, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2)
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(CheckpointError, match=r"num_local_experts = 4: mixture of experts") as e:
        load_checkpoint(tmp_path)
    assert "\n" not in str(e.value)


def test_a_model_larger_than_the_gpus_free_memory_is_refused_before_allocating(monkeypatch):
    from core.config import get_preset
    from engine.weights import ModelTooLarge, build_random, check_weights_fit
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (20 * 10**9, 24 * 10**9))
    check_weights_fit(get_preset("llama-3.1-8b"), torch.float16, "cuda")  # 16.1 GB: fits
    with pytest.raises(ModelTooLarge, match=r"qwen2.5-7b: its weights take 30.5 GB in float32, more than the 20.0 GB "
                                            r"free of the GPU's 24.0 GB"):
        build_random("qwen2.5-7b", dtype="float32", device="cuda")  # refused before touching the device


@pytest.mark.parametrize("preset", ["qwen2.5-7b", "llama-3.1-8b", "llama-3.2-1b", "qwen3-8b"])
def test_each_presets_family_written_as_a_hugging_face_config_is_transformers_model(preset):
    """A preset's architecture at a small width: its to_hf_dict builds transformers' class for the
    family (as the Hugging Face baseline does), which on the engine's weights gives its logits."""
    from dataclasses import replace

    from core.config import get_preset
    from engine.weights import build_random
    c = replace(get_preset(preset), num_hidden_layers=2, hidden_size=64, intermediate_size=32, vocab_size=300,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32 if preset == "qwen3-8b" else 16,
                bos_token_id=1, eos_token_id=2, context_length=256, max_position_embeddings=256)
    if c.rope_scaling is not None:  # scaled below position 100
        c = replace(c, rope_scaling=replace(c.rope_scaling, original_max_position_embeddings=32))
    model = build_random(c, dtype="float32", seed=1, std=0.3)
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**c.to_hf_dict())).eval()
    assert type(hf).__name__.lower().startswith(c.model_type)
    hf.load_state_dict(engine_to_hf(model))
    tokens = torch.randint(0, 300, (2, 100), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert relative_error(model.logits(model(tokens, torch.arange(100).expand(2, 100))), hf(tokens).logits) < 1e-4


def test_the_engine_cli_runs_a_config_json_and_refuses_an_unsupported_one(tmp_path, capsys):
    from engine.__main__ import main
    cfg = tmp_path / "llama" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(hf_model("llama").config.to_dict()))
    assert main(["generate", "--model", str(cfg), "--device", "cpu", "--dtype", "float32", "--new-tokens", "3",
                 "--prompt", "p16"]) == 0
    assert "seeded random weights" in capsys.readouterr().err
    bad = tmp_path / "moe.json"
    bad.write_text(json.dumps(dict(COMMON, model_type="qwen2_moe", num_experts=8)))
    out = tmp_path / "out"
    assert main(["bench", "--model", str(bad), "--device", "cpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "num_experts = 8: mixture of experts" in err[0]
    assert not out.exists()
