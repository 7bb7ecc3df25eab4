"""The engines: the loop that runs the model once per generated token.

- `naive`: no KV cache. Every pass puts the whole sequence so far through the model again.
- `cached`: a KV cache. One prefill pass over the prompt, then one single-token decode pass per
  token, each attending over the cached keys and values. Batch size 1, as part 2 of the part0 series.
- `batched`: the cached engine over a static batch: prompts (of any lengths) are prefilled
  together, then decoded together, one token per sequence per pass, until all are done.

Decoding is greedy and, by default, ignores EOS so every run does the same work. Every pass is
logged as a `PassRecord`; the token times come from the same clock (CUDA events on a GPU, so the
loop never waits on the GPU between tokens).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from engine.model import DenseKVCache, Qwen2
from engine.timing import Clock
from core.records import PassRecord, RequestRecord

ENGINES = ("naive", "cached", "batched")


@dataclass
class Generation:
    """What one run produced: the tokens, when each step's tokens were ready, and the pass log."""

    tokens: list[list[int]]                 # per sequence, the generated token ids
    step_times_s: list[float]               # when each decode step's tokens were ready
    passes: list[PassRecord] = field(default_factory=list)
    prompt_lens: list[int] = field(default_factory=list)
    eos_at: list[int | None] = field(default_factory=list)  # index of the first EOS, when stopping at EOS

    def request_records(self, run_id: str = "") -> list[RequestRecord]:
        """One record per sequence; all arrived at time 0 (a closed run)."""
        records = []
        for i, (n_prompt, toks) in enumerate(zip(self.prompt_lens, self.tokens)):
            produced = len(toks) if self.eos_at[i] is None else self.eos_at[i] + 1
            r = RequestRecord(request_id=str(i), arrival_s=0.0, prompt_tokens=n_prompt,
                              max_output_tokens=len(self.step_times_s), run_id=run_id)
            r.set_token_times(self.step_times_s[:produced])
            records.append(r)
        return records


def check_fits(model: Qwen2, prompt_lens: list[int], max_new_tokens: int) -> None:
    """Prompt + new tokens must fit in the model's context."""
    longest = max(prompt_lens)
    if longest + max_new_tokens > model.config.context_length:
        raise ValueError(f"prompt of {longest} tokens + {max_new_tokens} new tokens exceeds the model's "
                         f"context of {model.config.context_length} tokens")


def _pad(prompts: list[list[int]], device: torch.device) -> tuple[Tensor, Tensor]:
    """Right-pad prompts into [B, Pmax] (padding with token 0) and their lengths [B]."""
    longest = max(len(p) for p in prompts)
    tokens = torch.zeros(len(prompts), longest, dtype=torch.long)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = torch.tensor(p, dtype=torch.long)
    lens = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    return tokens.to(device), lens.to(device)


@torch.inference_mode()
def generate(model: Qwen2, prompts: list[list[int]], max_new_tokens: int = 256, *, engine: str = "batched",
             run_id: str = "", stop_at_eos: bool = False, decoder=None) -> Generation:
    """Greedy generation with one of the engines. `decoder` (an `engine.cuda_graphs.GraphDecoder`)
    owns the KV cache and runs the prefill and decode passes with fused kernels replayed as CUDA
    graphs; the loop, the clock and the pass log stay the same."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if engine == "cached" and len(prompts) != 1:
        raise ValueError("the cached engine runs one prompt at a time; use the batched engine for a batch")
    prompt_lens = [len(p) for p in prompts]
    check_fits(model, prompt_lens, max_new_tokens)
    device = model.embed_tokens.weight.device
    B, same_length = len(prompts), len(set(prompt_lens)) == 1
    tokens, lens = _pad(prompts, device)
    rows = torch.arange(B, device=device)
    out = torch.empty(B, max_new_tokens, dtype=torch.long, device=device)
    clock = Clock(device)
    shapes: list[tuple[list[int], list[int]]] = []  # (new_tokens, context_lens) of each pass
    marks: list[tuple[int, int]] = []               # (start mark, end mark) of each pass
    eos = model.config.eos_token_id
    done = torch.zeros(B, dtype=torch.bool, device=device) if stop_at_eos else None

    clock.mark()  # run start: time 0
    if engine == "naive":
        seq = torch.zeros(B, max(prompt_lens) + max_new_tokens, dtype=torch.long, device=device)
        seq[:, : tokens.shape[1]] = tokens
        for step in range(max_new_tokens):
            width = max(prompt_lens) + step
            begin = clock.mark()
            positions = torch.arange(width, device=device).expand(B, width)
            hidden = model(seq[:, :width], positions, causal=same_length)
            nxt = model.logits(hidden[rows, lens + step - 1]).argmax(-1)
            out[:, step] = nxt
            seq[rows, lens + step] = nxt
            marks.append((begin, clock.mark()))
            shapes.append(([n + step for n in prompt_lens], [0] * B))
            if stop_at_eos and _all_done(done, nxt, eos):
                break
    else:
        max_len = max(prompt_lens) + max_new_tokens
        if decoder is not None:
            cache = decoder.cache(B, max_len)
        else:
            cache = DenseKVCache(model.config, B, max_len, model.embed_tokens.weight.dtype, device)
        begin = clock.mark()
        if decoder is not None and same_length:
            nxt = decoder.prefill(tokens)
        else:
            positions = torch.arange(tokens.shape[1], device=device).expand(B, -1)
            hidden = model(tokens, positions, cache, causal=same_length)
            nxt = model.logits(hidden[rows, lens - 1]).argmax(-1)
        out[:, 0] = nxt
        marks.append((begin, clock.mark()))
        shapes.append((list(prompt_lens), [0] * B))
        finished = stop_at_eos and _all_done(done, nxt, eos)
        positions = lens.clone()  # where each sequence's next token goes
        if decoder is not None:
            decoder.start(nxt, positions)
        for step in range(1, max_new_tokens):
            if finished:
                break
            begin = clock.mark()
            if decoder is not None:
                nxt = decoder.step()  # tokens and positions advance on the GPU
            else:
                hidden = model(nxt.unsqueeze(1), positions.unsqueeze(1), cache,
                               kv_len=max(prompt_lens) + step)
                nxt = model.logits(hidden[:, 0]).argmax(-1)
                positions += 1
            out[:, step] = nxt
            marks.append((begin, clock.mark()))
            shapes.append(([1] * B, [n + step - 1 for n in prompt_lens]))
            finished = stop_at_eos and _all_done(done, nxt, eos)

    stamps = clock.seconds()
    steps = len(marks)
    generated = out[:, :steps].tolist()
    passes = [PassRecord.make(run_id, engine, i, new, ctx, stamps[a], stamps[b] - stamps[a])
              for i, ((a, b), (new, ctx)) in enumerate(zip(marks, shapes))]
    eos_at = [(toks.index(eos) if eos in toks else None) if stop_at_eos else None for toks in generated]
    return Generation(generated, [stamps[b] for _, b in marks], passes, prompt_lens, eos_at)


def _all_done(done: Tensor, nxt: Tensor, eos: int) -> bool:
    """Mark sequences that produced EOS; True once all have (this syncs with the GPU)."""
    done |= nxt == eos
    return bool(done.all())
