"""KV block accounting, and the prefix cache's sharing and eviction."""
import pytest

from core.config import get_preset
from core.roofline import GIB, get_gpu
from core.kv import BlockPool, PrefixBlockPool, blocks_for_gpu
from core.scheduler import ContinuousBatching
from core.scheduler import Sequence


def seq(prompt=10, hashes=None, index=0):
    return Sequence(str(index), 0.0, prompt, 5, block_hashes=hashes, index=index)


def test_capacity_from_gpu_memory():
    model, gpu = get_preset("qwen2.5-1.5b"), get_gpu("a10")  # 19 GiB measured free
    assert model.kv_bytes_per_token() == 28672
    assert blocks_for_gpu(model, gpu, 16) == int(19 * GIB // (28672 * 16))
    assert blocks_for_gpu(model, gpu, 16, free_gib=1.0) == int(GIB // (28672 * 16))


def test_blocks_are_allocated_as_sequences_grow_and_given_back():
    kv = BlockPool(5, block_size=4)
    a, b = seq(index=0), seq(index=1)
    assert kv.allocate(a, 5) and a.block_table == [0, 1]
    assert kv.allocate(a, 8) and a.block_table == [0, 1]  # still fits in two blocks
    assert kv.allocate(b, 9) and b.block_table == [2, 3, 4]
    assert not kv.allocate(a, 9) and a.block_table == [0, 1]  # no room: nothing changes
    assert kv.peak_used == 5 and kv.used_blocks() == 5
    kv.release(b)
    assert b.block_table == [] and kv.free_blocks == 3
    assert kv.allocate(a, 20) and len(a.block_table) == 5


def test_prefix_cache_shares_computed_prompt_blocks_and_evicts_least_recent():
    kv = PrefixBlockPool(12, block_size=4, hash_block_tokens=8)  # an entry is 2 blocks
    a = seq(prompt=20, hashes=[1, 2, 3])  # two full hash blocks (16 tokens) + 4 tokens
    assert kv.lookup(a) == 0
    assert kv.allocate(a, 20)
    kv.on_prompt_computed(a)
    assert a.shared == 2 and set(kv.entries) == {1, 2}
    b = seq(prompt=20, hashes=[1, 2, 9], index=1)
    assert kv.lookup(b) == 16
    assert kv.allocate(b, 20, hit=16)
    assert b.block_table[:4] == a.block_table[:4]  # the shared prefix: same physical blocks
    assert kv.entries[1][1] == 2  # two sequences hold it
    assert kv.used_blocks() == 5 + 1  # a's 5 blocks, plus b's own one
    kv.release(a)
    kv.release(b)
    assert list(kv.evictable) == [1, 2] and kv.room() == 12
    c = seq(prompt=40, index=2)  # 10 blocks, 8 free: evicts entry 1 (the least recent) only
    assert kv.allocate(c, 40)
    assert 1 not in kv.entries and 2 in kv.entries


def test_a_fully_cached_prompt_still_computes_its_last_hash_block():
    kv = PrefixBlockPool(8, block_size=4, hash_block_tokens=8)
    a = seq(prompt=16, hashes=[1, 2])
    kv.allocate(a, 16)
    kv.on_prompt_computed(a)
    kv.release(a)
    assert kv.lookup(seq(prompt=16, hashes=[1, 2], index=1)) == 8


def test_a_block_computed_twice_at_once_is_kept_once():
    kv = PrefixBlockPool(8, block_size=4, hash_block_tokens=8)
    a, b = seq(prompt=8, hashes=[7]), seq(prompt=8, hashes=[7], index=1)
    kv.allocate(a, 8)
    kv.allocate(b, 8)  # both miss: neither is computed yet
    kv.on_prompt_computed(a)
    kv.on_prompt_computed(b)
    assert a.block_table == b.block_table and kv.entries[7][1] == 2 and kv.free_blocks == 6


def test_bad_sizes_are_clear_errors():
    with pytest.raises(ValueError, match="multiple of block_size"):
        PrefixBlockPool(10, block_size=16, hash_block_tokens=24)
    with pytest.raises(ValueError, match="positive multiple"):
        PrefixBlockPool(10, block_size=16, hash_block_tokens=0)
    with pytest.raises(ValueError, match="swap"):
        ContinuousBatching(PrefixBlockPool(10, block_size=4, hash_block_tokens=8), max_model_len=40,
                           preemption="swap")
