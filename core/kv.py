"""The KV block pool: fixed-size blocks of cache, who holds which, what gets evicted.

Pure Python (no torch, no simpy): the simulator and the real engine allocate from the very same
pool. A sequence holding `t` tokens of cache holds `blocks_for(t, block_size)` blocks, listed in
order in `seq.block_table` (physical block ids, so a paged-attention engine uses the table as it
is: token i of the sequence lives in block `block_table[i // block_size]`, slot `i % block_size`).

Two pools with one interface:

- `BlockPool`: blocks are free or held by one sequence.
- `PrefixBlockPool`: also keeps computed prompt blocks after their sequence leaves, keyed by the
  trace's prompt block hashes, so a later request with the same prefix skips that prefill work
  and shares those blocks; unreferenced entries are evicted least recently used first.

What happens to a preempted sequence's cache (dropped, or swapped to host memory) is the
scheduler's choice (`core.scheduler`); the pool only hands blocks out and takes them back.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from core.config import ModelConfig
from core.roofline import GIB, GPUSpec, free_for_cache_gib

if TYPE_CHECKING:
    from core.scheduler import Sequence


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks needed to hold `tokens` tokens: the ceiling of tokens / block_size."""
    return -(-tokens // block_size)


def blocks_for_gpu(model: ModelConfig, gpu: GPUSpec, block_size: int = 16, free_gib: float | None = None,
                   dtype_bytes: int = 2) -> int:
    """How many KV blocks fit in the memory left for the cache on `gpu` (measured or estimated
    by the roofline), or in `free_gib` when given."""
    if free_gib is None:
        free_gib, _ = free_for_cache_gib(model, gpu, dtype_bytes)
    return int(free_gib * GIB // (model.kv_bytes_per_token(dtype_bytes) * block_size))


class BlockPool:
    """`num_blocks` blocks of `block_size` token slots, handed to sequences as they grow."""

    prefix_caching = False

    def __init__(self, num_blocks: int, block_size: int = 16):
        if num_blocks < 1:
            raise ValueError(f"KV cache of {num_blocks} blocks: there is no room for any request")
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Free blocks are a stack: given-back ids on top (the last given back is handed out first),
        # under them the ids never handed out, num_blocks - unused, ..., num_blocks - 1, kept as a
        # count rather than a list, so an idle pool of any size costs a few bytes (a list of every
        # id was 10 MB per H200 replica).
        self.free_ids: list[int] = []  # given back, not yet handed out again
        self.unused = num_blocks  # ids num_blocks - unused .. num_blocks - 1 were never handed out
        self.peak_used = 0

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def free_blocks(self) -> int:
        return len(self.free_ids) + self.unused

    def _take(self, need: int, table: list[int]) -> None:
        """Append `need` free ids to `table`, from the top of the free stack (the caller checked
        that there are that many)."""
        free = self.free_ids
        reused = min(need, len(free))
        if reused == 1:
            table.append(free.pop())
        elif reused:
            table += free[:-reused - 1:-1]  # the last `reused` ids, last first
            del free[-reused:]
        fresh = need - reused
        if fresh:
            start = self.num_blocks - self.unused
            table += range(start, start + fresh)
            self.unused -= fresh

    def used_blocks(self) -> int:
        """Blocks held by live sequences (cached-but-unreferenced prefix blocks don't count)."""
        return self.num_blocks - self.room()

    def room(self) -> int:
        """Blocks a sequence could still be given (free, or evictable)."""
        return len(self.free_ids) + self.unused

    def blocks_for(self, tokens: int) -> int:
        return blocks_for(tokens, self.block_size)

    def lookup(self, seq: "Sequence") -> int:
        """Tokens of `seq`'s prompt already in the cache (always 0 without prefix caching)."""
        return 0

    def allocate(self, seq: "Sequence", tokens: int, hit: int = 0) -> bool:
        """Grow `seq`'s table to hold `tokens` tokens; False (and no change) if they don't fit."""
        table = seq.block_table
        bs = self.block_size
        have = len(table)
        if tokens <= have * bs:
            return True  # the common case: its last block has room
        need = (tokens + bs - 1) // bs - have
        free = self.free_ids
        if need <= len(free):  # given-back ids: the last given back first
            if need == 1:
                table.append(free.pop())
            else:
                table += free[:-need - 1:-1]
                del free[-need:]
        elif need > len(free) + self.unused:
            return False
        else:
            self._take(need, table)
        used = self.num_blocks - len(free) - self.unused
        if used > self.peak_used:
            self.peak_used = used
        return True

    def release(self, seq: "Sequence") -> None:
        """Give back every block `seq` holds."""
        self.free_ids.extend(seq.block_table)
        seq.block_table = []

    def on_prompt_computed(self, seq: "Sequence") -> None:
        """Called once a sequence's whole prompt is in the cache (prefix caching keeps it)."""


class PrefixBlockPool(BlockPool):
    """A block pool that keeps computed prompt blocks for reuse, keyed by prompt block hashes.

    The hashes come from the trace, one per `hash_block_tokens` tokens of prompt (Mooncake's
    traces use 512), each depending on all the prompt before it, so a prefix hit is a run of
    leading hashes found here. Only full hash blocks are cached; at least one prompt token is
    always computed (a fully cached prompt recomputes its last hash block), because the pass
    must produce the first output token.
    """

    prefix_caching = True

    def __init__(self, num_blocks: int, block_size: int = 16, hash_block_tokens: int = 512):
        super().__init__(num_blocks, block_size)
        if hash_block_tokens < 1 or hash_block_tokens % block_size:
            raise ValueError(f"hash_block_tokens ({hash_block_tokens}) must be a positive multiple of "
                             f"block_size ({block_size})")
        self.hash_block_tokens = hash_block_tokens
        self.per_entry = hash_block_tokens // block_size
        self.entries: dict[int, list] = {}  # hash -> [block ids, refcount]
        self.evictable: OrderedDict[int, None] = OrderedDict()  # refcount 0, least recent first
        self.hit_tokens = 0  # prefill tokens skipped thanks to the cache, over the run

    def room(self) -> int:
        return len(self.free_ids) + self.unused + len(self.evictable) * self.per_entry

    def lookup(self, seq: "Sequence") -> int:
        hashes = seq.block_hashes
        if not hashes:
            return 0
        full = min(len(hashes), seq.prompt_tokens // self.hash_block_tokens)
        hits = 0
        while hits < full and hashes[hits] in self.entries:
            hits += 1
        tokens = hits * self.hash_block_tokens
        if tokens >= seq.num_tokens:
            tokens -= self.hash_block_tokens
        return tokens

    def allocate(self, seq: "Sequence", tokens: int, hit: int = 0) -> bool:
        pe = self.per_entry
        new_hits = seq.block_hashes[seq.shared:hit // self.hash_block_tokens] if hit else ()
        reclaimed = sum(1 for h in new_hits if h in self.evictable)
        need = blocks_for(tokens, self.block_size) - len(seq.block_table) - len(new_hits) * pe
        if need > len(self.free_ids) + self.unused + (len(self.evictable) - reclaimed) * pe:
            return False
        for h in new_hits:
            entry = self.entries[h]
            if entry[1] == 0:
                del self.evictable[h]
            entry[1] += 1
            seq.block_table.extend(entry[0])
            seq.shared += 1
        if new_hits:
            self.hit_tokens += len(new_hits) * self.hash_block_tokens
        if need > 0:
            free = self.free_ids
            while len(free) + self.unused < need:
                h, _ = self.evictable.popitem(last=False)
                free.extend(self.entries.pop(h)[0])
            self._take(need, seq.block_table)
        used = self.num_blocks - len(self.free_ids) - self.unused
        if used > self.peak_used:
            self.peak_used = used
        return True

    def release(self, seq: "Sequence") -> None:
        pe = self.per_entry
        for h in seq.block_hashes[:seq.shared] if seq.shared else ():
            entry = self.entries[h]
            entry[1] -= 1
            if entry[1] == 0:
                self.evictable[h] = None
        self.free_ids.extend(seq.block_table[seq.shared * pe:])
        seq.block_table = []
        seq.shared = 0

    def on_prompt_computed(self, seq: "Sequence") -> None:
        """Turn the sequence's full prompt hash blocks into shared cache entries."""
        hashes = seq.block_hashes
        if not hashes:
            return
        pe = self.per_entry
        full = min(len(hashes), seq.prompt_tokens // self.hash_block_tokens)
        for i in range(seq.shared, full):
            h = hashes[i]
            ids = seq.block_table[i * pe:(i + 1) * pe]
            entry = self.entries.get(h)
            if entry is None:
                self.entries[h] = [ids, 1]
            else:  # another sequence computed the same block meanwhile: share theirs, free ours
                if entry[1] == 0:
                    del self.evictable[h]
                entry[1] += 1
                seq.block_table[i * pe:(i + 1) * pe] = entry[0]
                self.free_ids.extend(ids)
            seq.shared += 1
