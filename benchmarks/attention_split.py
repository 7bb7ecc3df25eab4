"""Batch-1 decode step time against the attention's slice length, at a short and a long context.

    python benchmarks/attention_split.py
"""
from __future__ import annotations

import torch
import triton.testing

from engine.cuda_graphs import GraphDecoder
from engine.prompts import prompt_ids
from engine.weights import build_random


def main() -> None:
    model = build_random("qwen2.5-1.5b", dtype="float16", device="cuda")
    for prompt in ("p256", "p4096"):
        ids = prompt_ids(prompt)
        for split in (None, 64, 128, 256, 512, 1024):
            if prompt == "p256" and split == 1024:
                continue
            dec = GraphDecoder(model, True, pdl=True, attention_split=split)
            dec.cache(1, len(ids) + 256)
            first = dec.prefill(torch.tensor([ids], device="cuda")).clone()
            middle = len(ids) + 128
            dec.start(first, torch.tensor([middle], device="cuda"))
            ms = triton.testing.do_bench(lambda: (dec.positions.fill_(middle), dec.step()), warmup=20, rep=200,
                                         return_mode="median")
            print(f"{prompt} split {str(split or 'auto(' + str(dec.attention.split) + ')'):>10}: {ms:.4f} ms/step")
            del dec
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
