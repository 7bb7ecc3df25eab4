"""The peer: Hugging Face transformers on the very same weights.

`generate` with `cache_implementation="static"` is transformers' fastest mode (on a GPU it compiles
the decode step with CUDA graphs). Token times come from a logits processor that stamps the clock
each time a step's logits are ready, so nothing waits on the GPU that transformers would not.
"""
from __future__ import annotations

import torch

from engine.engines import Generation
from engine.model import Qwen2
from engine.timing import Clock
from engine.weights import engine_to_hf
from core.records import PassRecord


class _Stamp:
    """A logits processor that marks the clock at every generation step and changes nothing."""

    def __init__(self, clock: Clock):
        self.clock, self.marks = clock, []

    def __call__(self, input_ids, scores):
        self.marks.append(self.clock.mark())
        return scores


class HFBaseline:
    """transformers' model class for `model`'s family (Qwen2ForCausalLM, LlamaForCausalLM, ...)
    holding a copy of `model`'s weights."""

    def __init__(self, model: Qwen2):
        import transformers

        cfg = model.config.to_hf_dict() | {"eos_token_id": None, "pad_token_id": 0}
        hf_config = transformers.AutoConfig.for_model(**cfg)
        device, dtype = model.embed_tokens.weight.device, model.embed_tokens.weight.dtype
        with torch.device(device):  # built (and randomly initialised) on the device: fast on a GPU
            hf = transformers.AutoModelForCausalLM.from_config(hf_config)
        hf = hf.to(dtype)
        hf.load_state_dict(engine_to_hf(model))
        self.hf = hf.eval()
        self.device = device

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, run_id: str = "") -> Generation:
        if len({len(p) for p in prompts}) != 1:
            raise ValueError("the Hugging Face baseline runs batches of equal-length prompts")
        from transformers import LogitsProcessorList

        ids = torch.tensor(prompts, dtype=torch.long, device=self.device)
        clock = Clock(self.device)
        stamp = _Stamp(clock)
        clock.mark()
        out = self.hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                               min_new_tokens=max_new_tokens, do_sample=False,
                               cache_implementation="static", logits_processor=LogitsProcessorList([stamp]))
        stamps = clock.seconds()
        times = [stamps[m] for m in stamp.marks]
        B, P = ids.shape
        passes, start = [], 0.0
        for i, end in enumerate(times):  # a step spans from the previous step's logits to its own
            new, ctx = ([P] * B, [0] * B) if i == 0 else ([1] * B, [P + i - 1] * B)
            passes.append(PassRecord.make(run_id, "hf", i, new, ctx, start, end - start))
            start = end
        return Generation(out[:, P:].tolist(), times, passes, [P] * B, [None] * B)
