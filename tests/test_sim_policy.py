"""Schedulers on hand-made scenarios whose answers can be worked out on paper.

Every pass takes 1 s (ConstantCost), so token times are pass counts.
"""
import pytest

from sim.cost import ConstantCost
from core.kv import BlockPool
from core.scheduler import (ChunkedPrefill, ContinuousBatching, DecodePriority, Sequence, StaticBatching, by_priority,
                        shortest_prompt_first)
from sim.replica import SwapLink
from sim_helpers import checked_run, token_times, trace_of

ONE = ConstantCost(1.0)


def big_kv():
    return BlockPool(1000, block_size=4)


def test_continuous_prefills_together_then_decodes_together():
    tr = trace_of([(0, 4, 3), (0, 4, 3)])
    res = checked_run(tr, lambda: ContinuousBatching(big_kv()), ONE)
    assert token_times(res) == {"0": [1, 2, 3], "1": [1, 2, 3]}
    assert [p.kind for p in res.passes] == ["prefill", "decode", "decode"]
    assert [p.context_lens for p in res.passes] == [[0, 0], [4, 4], [5, 5]]


def test_continuous_gives_a_new_prompt_priority_at_the_next_pass_boundary():
    # B arrives mid-pass at 1.5: admitted at the boundary t=2, A's decode waits a pass.
    tr = trace_of([(0, 4, 4), (1.5, 2, 2)])
    res = checked_run(tr, lambda: ContinuousBatching(big_kv()), ONE)
    assert token_times(res) == {"0": [1, 2, 4, 5], "1": [3, 4]}
    assert [(p.new_tokens, p.context_lens) for p in res.passes] == [
        ([4], [0]), ([1], [4]), ([2], [0]), ([1, 1], [5, 2]), ([1], [6])]


def test_each_request_records_when_it_was_taken_in_and_when_its_first_pass_started():
    # A at 0 starts at once; B, arriving mid-pass at 1.5, is taken in then and first runs at t=2.
    tr = trace_of([(0, 4, 4), (1.5, 2, 2)])
    res = checked_run(tr, lambda: ContinuousBatching(big_kv()), ONE)
    assert {r.request_id: (r.queued_s, r.scheduled_s) for r in res.requests} == {"0": (0, 0), "1": (1.5, 2)}


def test_continuous_respects_max_num_seqs():
    tr = trace_of([(0, 4, 2), (0, 4, 2), (0, 4, 2)])
    res = checked_run(tr, lambda: ContinuousBatching(big_kv(), max_num_seqs=2), ONE)
    assert token_times(res) == {"0": [1, 2], "1": [1, 2], "2": [3, 4]}


def test_continuous_token_budget_splits_prefills():
    kv = BlockPool(1000, block_size=4)
    tr = trace_of([(0, 6, 1), (0, 6, 1)])
    res = checked_run(tr, lambda: ContinuousBatching(kv, max_num_batched_tokens=8, max_model_len=8), ONE)
    assert [p.new_tokens for p in res.passes] == [[6], [6]]


def test_chunked_prefill_mixes_decodes_with_prompt_chunks():
    # budget 4: A's prompt in chunks 4+2, B's 2+1 alongside; A decodes beside B's last chunk.
    tr = trace_of([(0, 6, 2), (0, 3, 1)])
    res = checked_run(tr, lambda: ChunkedPrefill(big_kv(), max_num_seqs=4, max_num_batched_tokens=4), ONE)
    assert [(p.new_tokens, p.context_lens) for p in res.passes] == [
        ([4], [0]), ([2, 2], [4, 0]), ([1, 1], [6, 2])]
    assert token_times(res) == {"0": [2, 3], "1": [3]}


def test_chunked_prefill_serves_decodes_before_new_prompts():
    tr = trace_of([(0, 2, 3), (0.5, 8, 1)])
    res = checked_run(tr, lambda: ChunkedPrefill(big_kv(), max_num_seqs=4, max_num_batched_tokens=4), ONE)
    # t=1: A decodes (1 token) and B gets the other 3 of the budget; then 1+3; then B's last 2.
    assert [p.new_tokens for p in res.passes] == [[2], [1, 3], [1, 3], [2]]
    assert token_times(res) == {"0": [1, 2, 3], "1": [4]}


def test_static_batching_waits_for_a_full_batch_or_the_timeout():
    # Batch of 2: A waits for B (t=1); C arrives while the batch runs, then waits alone for its
    # timeout (2 + 10 = 12) since nobody else comes.
    tr = trace_of([(0, 2, 1), (1, 2, 3), (2, 2, 1)])
    res = checked_run(tr, lambda: StaticBatching(big_kv(), batch_size=2, timeout_s=10), ONE)
    assert token_times(res) == {"0": [2], "1": [2, 3, 4], "2": [13]}
    # a finished member stops producing tokens, but nothing joins until the batch is done
    assert [p.new_tokens for p in res.passes] == [[2, 2], [1], [1], [2]]


def test_static_batching_reserves_the_whole_cache_and_never_preempts():
    kv = BlockPool(4, block_size=4)  # 16 tokens: one request of 6+4-1 = 9 tokens at a time
    tr = trace_of([(0, 6, 4), (0, 6, 4)])
    res = checked_run(tr, lambda: StaticBatching(kv, batch_size=2, timeout_s=0, max_model_len=16), ONE)
    assert token_times(res) == {"0": [1, 2, 3, 4], "1": [5, 6, 7, 8]}
    assert all(r.preemptions == 0 for r in res.requests)


def recompute_scenario_kv():
    # 4 blocks of 2 tokens: A and B (prompt 3, output 4) fit together only until their 5th token.
    return BlockPool(4, block_size=2)


def test_preemption_by_recompute_drops_the_newest_and_recomputes_it_later():
    tr = trace_of([(0, 3, 4), (0, 3, 4)])
    res = checked_run(tr, lambda: ContinuousBatching(recompute_scenario_kv(), max_model_len=8), ONE)
    # t=2: A needs a third block, none is free: B (ranked last) is preempted. t=4: A is done
    # and B recomputes its 3 prompt + 2 generated tokens in one prefill, then decodes.
    assert token_times(res) == {"0": [1, 2, 3, 4], "1": [1, 2, 5, 6]}
    assert [r.preemptions for r in res.requests] == [0, 1]
    assert [(p.new_tokens, p.context_lens) for p in res.passes][-2:] == [([5], [0]), ([1], [5])]


def test_preemption_by_swap_pays_the_transfer_both_ways():
    # 1 byte per token at 4 bytes/s: swapping B's 4 cached tokens takes 1 s each way.
    tr = trace_of([(0, 3, 4), (0, 3, 4)])
    res = checked_run(tr, lambda: ContinuousBatching(recompute_scenario_kv(), max_model_len=8, preemption="swap"),
                      ONE, swap_link=SwapLink(bytes_per_token=1, bytes_per_s=4))
    assert token_times(res) == {"0": [1, 2, 4, 5], "1": [1, 2, 7, 8]}
    swaps = [p.duration_s for p in res.passes]
    assert swaps == [1, 1, 2, 1, 2, 1]  # swap-out with A's pass at t=2, swap-in with B's at t=5
    assert res.passes[4].kind == "decode"  # B resumes where it was: no recompute


def test_a_request_that_can_never_fit_is_rejected_with_its_reason():
    kv = BlockPool(4, block_size=4)
    tr = trace_of([(0, 10, 10), (0, 4, 2)])
    res = checked_run(tr, lambda: ContinuousBatching(kv, max_model_len=16), ONE)
    bad, good = res.requests
    assert bad.rejected and "exceeds max_model_len 16" in bad.rejected
    assert bad.output_tokens == 0 and good.completed


def test_a_kv_cache_smaller_than_one_request_is_a_clear_error():
    with pytest.raises(ValueError, match="fewer than one request"):
        ContinuousBatching(BlockPool(4, block_size=4), max_model_len=32768)
    with pytest.raises(ValueError, match="no room"):
        BlockPool(0)


def test_nonsense_budgets_are_clear_errors():
    with pytest.raises(ValueError, match="never be scheduled"):
        ContinuousBatching(big_kv(), max_num_batched_tokens=100, max_model_len=200)
    with pytest.raises(ValueError, match="could never decode"):
        ChunkedPrefill(big_kv(), max_num_seqs=64, max_num_batched_tokens=32)


def test_priority_classes_jump_the_queue_and_shortest_prompt_first_too():
    rows = [(0, 4, 1), (0.1, 8, 1), (0.2, 2, 1)]
    # one at a time: A runs from t=0; then by priority (B=0 before C=5), or by prompt (C first)
    pri = checked_run(trace_of(rows, priority=[1, 0, 5]),
                      lambda: ContinuousBatching(big_kv(), max_num_seqs=1, order=by_priority), ONE)
    assert token_times(pri) == {"0": [1], "1": [2], "2": [3]}
    spf = checked_run(trace_of(rows), lambda: ContinuousBatching(big_kv(), max_num_seqs=1,
                                                                 order=shortest_prompt_first), ONE)
    assert token_times(spf) == {"0": [1], "2": [2], "1": [3]}


def test_decode_priority_holds_new_prompts_back_for_a_few_decode_passes():
    # A decodes; B arrives at 1.5 but waits until A has run 3 decode passes since its prefill.
    tr = trace_of([(0, 4, 6), (1.5, 2, 1)])
    res = checked_run(tr, lambda: DecodePriority(big_kv(), waiting_served_ratio=2, max_waiting_passes=3), ONE)
    assert token_times(res) == {"0": [1, 2, 3, 4, 6, 7], "1": [5]}


def test_decode_priority_admits_when_enough_requests_wait():
    tr = trace_of([(0, 4, 6), (1.5, 2, 1), (1.6, 2, 1)])
    res = checked_run(tr, lambda: DecodePriority(big_kv(), waiting_served_ratio=2, max_waiting_passes=100), ONE)
    assert token_times(res) == {"0": [1, 2, 4, 5, 6, 7], "1": [3], "2": [3]}


def test_the_engine_call_sequence_by_hand():
    """What a real engine does: add sequences with their token ids, then schedule / run /
    on_pass_done with the tokens it sampled; a sequence that samples EOS stops there."""
    sched = ContinuousBatching(big_kv(), eos_token_id=99)
    a = Sequence("a", 0.0, 5, 10, token_ids=[1, 2, 3, 4, 5])
    b = Sequence("b", 0.0, 3, 10, index=1, token_ids=[7, 8, 9])
    assert sched.add(a) is None and sched.add(b) is None
    plan = sched.schedule(0.0)
    assert plan.seqs == [a, b] and plan.new_tokens == [5, 3] and plan.context_lens == [0, 0]
    assert not plan.decode
    assert [len(s.block_table) for s in plan.seqs] == [2, 1]  # blocks of 4 for 5 and 3 tokens
    assert sched.on_pass_done(plan, 0.1, [11, 12]) == []
    assert a.token_ids == [1, 2, 3, 4, 5, 11] and b.token_ids == [7, 8, 9, 12]
    plan = sched.schedule(0.1)
    assert plan.new_tokens == [1, 1] and plan.context_lens == [5, 3] and plan.decode
    assert sched.on_pass_done(plan, 0.2, [13, 99]) == [b]  # b sampled end-of-sequence
    assert b.finish_s == 0.2 and b.record().output_tokens == 2 and b.block_table == []
    assert b.token_ids == [7, 8, 9, 12, 99]
    assert sched.schedule(0.2).seqs == [a]


def test_a_preempted_sequence_keeps_its_tokens_for_the_recompute():
    sched = ContinuousBatching(recompute_scenario_kv(), max_model_len=8)
    a = Sequence("a", 0.0, 3, 4, token_ids=[1, 2, 3])
    b = Sequence("b", 0.0, 3, 4, index=1, token_ids=[4, 5, 6])
    sched.add(a), sched.add(b)
    sampled = iter(range(100, 200))
    plans = []
    while b.finish_s is None:
        plan = sched.schedule(0.0)
        plans.append(plan)
        sched.on_pass_done(plan, 0.0, [next(sampled) for _ in plan.seqs])
    recompute = next(p for p in plans if p.seqs == [b] and p.context_lens == [0] and p.new_tokens[0] > 3)
    assert recompute.new_tokens == [5] and b.preemptions == 1
    assert b.token_ids[:5] == [4, 5, 6, 101, 103]  # the prompt, then what it had sampled before
    assert len(b.token_ids) == 7 and len(a.token_ids) == 7


def test_a_swap_names_the_blocks_to_copy_out_and_back_in():
    sched = ContinuousBatching(recompute_scenario_kv(), max_model_len=8, preemption="swap")
    a, b = Sequence("a", 0.0, 3, 4), Sequence("b", 0.0, 3, 4, index=1)
    sched.add(a), sched.add(b)
    outs, ins = [], []
    while b.finish_s is None:
        plan = sched.schedule(0.0)
        outs += [(s, list(ids), s.num_computed) for s, ids in plan.swap_out]
        ins += [(s, list(ids), s.num_computed) for s, ids in plan.swap_in]
        sched.on_pass_done(plan, 0.0)
    (out_seq, out_ids, out_tokens), = outs
    (in_seq, in_ids, in_tokens), = ins
    assert out_seq is in_seq is b and out_tokens == in_tokens == 4 and len(out_ids) == len(in_ids) == 2


def test_with_overlap_an_arrival_waits_for_the_pass_already_planned():
    # A decodes from t=1; B arrives at 1.5, during A's pass [1, 2]. Without overlap B's prompt runs
    # at the boundary t=2. With overlap the pass [2, 3] was planned while [1, 2] ran (B not there
    # yet), so B's prompt runs at t=3.
    tr = trace_of([(0, 4, 5), (1.5, 2, 1)])
    plain = checked_run(tr, lambda: ContinuousBatching(big_kv()), ONE)
    assert token_times(plain) == {"0": [1, 2, 4, 5, 6], "1": [3]}
    overlap = checked_run(tr, lambda: ContinuousBatching(big_kv()), ONE, overlap=True)
    assert token_times(overlap) == {"0": [1, 2, 3, 5, 6], "1": [4]}
    # an idle engine plans at once: an arrival with nothing running waits for no one
    lone = checked_run(trace_of([(0, 4, 2), (5.5, 2, 1)]), lambda: ContinuousBatching(big_kv()), ONE, overlap=True)
    assert token_times(lone) == {"0": [1, 2], "1": [6.5]}
