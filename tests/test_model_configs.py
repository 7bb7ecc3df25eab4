"""Model configs without the engine: Hugging Face config.json files of each family read into the
same numbers as the presets, the architectures the engine does not run refused with one line, and
`--model` taking a preset or a config.json in the simulator and the roofline."""
import json

import pytest

from core.config import PRESETS, ModelConfig, UnsupportedModel, get_preset, resolve_model
from sim.__main__ import main as sim_main

LLAMA_31_8B = {  # meta-llama/Llama-3.1-8B's config.json
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 128256}
QWEN3_8B = {  # Qwen/Qwen3-8B's config.json
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 40960, "max_window_layers": 36,
    "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936}


def test_published_configs_read_into_the_presets():
    from dataclasses import replace
    assert ModelConfig.from_hf_config(LLAMA_31_8B) == replace(get_preset("llama-3.1-8b"), name="llama")
    assert ModelConfig.from_hf_config(QWEN3_8B) == replace(get_preset("qwen3-8b"), name="qwen3")
    # the Qwen2.5-1.5B preset's numbers are what the engine has always used
    assert get_preset("qwen2.5-1.5b").num_parameters == 1_543_714_304


def test_preset_sizes_by_hand():
    # Llama-3.1-8B: 32 layers of q 4096x4096, k and v 1024x4096, o 4096x4096, three 4096x14336 MLP
    # matrices and two norms; the embedding and a separate lm_head of 128256x4096; a final norm.
    layer = 4096 * 4096 * 2 + 1024 * 4096 * 2 + 3 * 4096 * 14336 + 2 * 4096
    params = 32 * layer + 2 * 128256 * 4096 + 4096
    llama = get_preset("llama-3.1-8b")
    assert llama.num_parameters == params == 8_030_261_248  # the published 8.03B
    assert llama.weight_bytes_read_per_pass() == 2 * (params - 128256 * 4096)  # the lookup table is not read
    assert llama.kv_bytes_per_token() == 2 * 2 * 32 * 8 * 128 == 131072
    # Qwen3-8B: head_dim 128 with 32 heads is 4096 wide; q and k norms of 128 each layer
    layer = 4096 * 4096 * 2 + 1024 * 4096 * 2 + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128
    qwen3 = get_preset("qwen3-8b")
    assert qwen3.num_parameters == 36 * layer + 2 * 151936 * 4096 + 4096
    assert qwen3.kv_bytes_per_token() == 2 * 2 * 36 * 8 * 128
    # Llama-3.2-1B: tied, head_dim 64; FLOPs count q as heads x head_dim = 2048 wide
    small = get_preset("llama-3.2-1b")
    assert small.kv_bytes_per_token() == 2 * 2 * 16 * 8 * 64
    matmul = 16 * (2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192) + 128256 * 2048
    assert small.flops_per_token(0) == 2 * matmul
    assert small.weight_bytes_read_per_pass() == small.weight_bytes()  # tied: the lm_head is the table


def test_head_dim_apart_from_hidden_over_heads_sizes_the_cache_and_flops():
    c = ModelConfig.from_hf_config(dict(QWEN3_8B, hidden_size=2560, head_dim=128, num_attention_heads=32,
                                        num_key_value_heads=8))
    assert c.head_dim == 128 and c.q_size == 4096 != c.hidden_size
    assert c.kv_bytes_per_token() == 2 * 2 * 36 * 8 * 128


def _refused(d, match):
    with pytest.raises(UnsupportedModel, match=match) as e:
        ModelConfig.from_hf_config(d)
    assert "\n" not in str(e.value)


def test_architectures_the_engine_does_not_run_are_refused_naming_the_field():
    _refused(dict(LLAMA_31_8B, model_type="mixtral", num_local_experts=8), r"num_local_experts = 8: mixture of experts")
    _refused(dict(QWEN3_8B, model_type="qwen3_moe", num_experts=128), r"num_experts = 128: mixture of experts")
    _refused(dict(LLAMA_31_8B, model_type="mistral", sliding_window=4096), r"sliding_window = 4096: sliding-window")
    _refused(dict(QWEN3_8B, use_sliding_window=True), r"use_sliding_window = true")
    _refused(dict(LLAMA_31_8B, model_type="deepseek_v3", kv_lora_rank=512), r"kv_lora_rank = 512: multi-head latent")
    _refused(dict(LLAMA_31_8B, model_type="gpt2"), r"model_type = \"gpt2\": the engine runs qwen2, llama, qwen3, mistral")
    _refused(dict(LLAMA_31_8B, rope_scaling={"rope_type": "yarn", "factor": 4.0}), r"rope_scaling.rope_type = \"yarn\"")
    _refused(dict(LLAMA_31_8B, hidden_act="gelu"), r"hidden_act = \"gelu\"")
    _refused(dict(LLAMA_31_8B, attention_bias=True), r"attention_bias = true: a llama model with biases on q, k, v and o")


def test_mistral_without_sliding_window_and_transformers_5_rope_parameters_read():
    d = dict(LLAMA_31_8B, model_type="mistral", sliding_window=None, rope_scaling=None)
    d.pop("rope_theta")
    d["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6}
    c = ModelConfig.from_hf_config(d)
    assert (c.model_type, c.rope_theta, c.rope_scaling, c.attention_bias) == ("mistral", 1e6, None, False)


def test_resolve_model_takes_a_preset_a_config_json_or_its_folder(tmp_path):
    assert resolve_model("llama-3.1-8b") is PRESETS["llama-3.1-8b"]
    folder = tmp_path / "Llama-3.1-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_31_8B))
    for arg in (folder, folder / "config.json"):
        c = resolve_model(str(arg))
        assert c.name == "Llama-3.1-8B" and c.num_parameters == PRESETS["llama-3.1-8b"].num_parameters
    with pytest.raises(ValueError, match="unknown model preset"):
        resolve_model("llama-9")
    with pytest.raises(ValueError, match="no such file"):
        resolve_model(str(tmp_path / "nope" / "config.json"))


@pytest.fixture
def trace_csv(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{i * 0.1:.2f},{200 + 50 * i},{20}\n"
                                                                        for i in range(20)))
    return path


def test_sim_runs_a_new_preset_and_a_config_json_by_the_roofline_saying_so(trace_csv, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sim.cost._said", set())
    cfg = tmp_path / "Qwen3-8B" / "config.json"  # (a preset without a calibration of its own)
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(QWEN3_8B))
    outs = []
    for i, model in enumerate(("qwen3-8b", str(cfg))):
        assert sim_main(["run", "--trace", str(trace_csv), "--model", model, "--pass-log", "off",
                         "--out", str(tmp_path / f"out{i}")]) == 0
        captured = capsys.readouterr()
        assert "no calibration for" in captured.err and "roofline" in captured.err
        outs.append(captured.out)
    assert "Successful requests:                    20" in outs[0]
    # the same architecture, so the same times
    def metrics(text):  # (the wall time of the simulation, after them, varies)
        return text.split("Benchmark duration")[1].split("simulated ")[0]
    assert metrics(outs[0]) == metrics(outs[1])
    # an 8B model is slower than the 1.5B on the same trace
    assert sim_main(["run", "--trace", str(trace_csv), "--pass-log", "off", "--out", str(tmp_path / "o2")]) == 0
    small = capsys.readouterr().out
    def duration(text):
        return float(text.split("Benchmark duration (s):")[1].split()[0])
    assert duration(outs[0]) > duration(small)


def test_sim_refuses_an_unsupported_config_in_one_line_and_writes_nothing(trace_csv, tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(LLAMA_31_8B, model_type="mixtral", num_local_experts=8)))
    out = tmp_path / "out"
    assert sim_main(["run", "--trace", str(trace_csv), "--model", str(cfg), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "num_local_experts = 8" in err[0]
    assert not out.exists()


def test_engine_roofline_takes_a_preset_and_refuses_a_bad_config(tmp_path, capsys):
    from engine.__main__ import main as engine_main
    assert engine_main(["roofline", "--model", "qwen3-8b", "--gpu", "h200"]) == 0
    assert "147,456 bytes/token" in capsys.readouterr().out
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(QWEN3_8B, use_sliding_window=True)))
    assert engine_main(["roofline", "--model", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "use_sliding_window = true" in err[0]


def test_the_memory_left_for_the_cache_counts_an_untied_embedding():
    from core.roofline import GIB, free_for_cache_gib, get_gpu
    llama = get_preset("llama-3.1-8b")
    free, measured = free_for_cache_gib(llama, get_gpu("h100"))
    assert not measured and free == pytest.approx(0.9 * 80e9 / GIB - 2 * 8_030_261_248 / GIB)
