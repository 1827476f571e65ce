"""KV block manager: free list, reference counts, prefix caching by chained hashes, LRU reuse."""

import numpy as np
import pytest

from infc.compiler.runtime.block_manager import BlockManager
from infc.compiler.runtime.sampler import SamplingParams
from infc.compiler.runtime.sequence import Sequence


def make_seq(prompt_ids, seq_id=0):
    return Sequence(seq_id, list(prompt_ids), SamplingParams(), np.random.default_rng(0))


def admit_and_compute(blocks, seq):
    """Admit a sequence, compute its whole prompt in one chunk, register its full blocks."""
    hits = blocks.prefix_hits(seq)
    num_new = seq.num_tokens - len(hits) * blocks.block_size
    assert blocks.can_allocate(seq, hits, num_new)
    blocks.allocate(seq, hits, num_new)
    seq.num_computed += num_new
    blocks.cache_full_blocks(seq)
    return hits


def test_allocate_and_free_return_every_block():
    blocks = BlockManager(8, 4)
    seq = make_seq(range(10))
    admit_and_compute(blocks, seq)
    assert len(seq.block_table) == 3 and blocks.num_free_blocks == 5
    assert all(blocks.ref_counts[b] == 1 for b in seq.block_table)
    blocks.free(seq)
    assert blocks.num_free_blocks == 8 and seq.block_table == [] and not any(blocks.ref_counts)


def test_append_slot_grows_at_block_boundaries():
    blocks = BlockManager(8, 4)
    seq = make_seq(range(4))
    admit_and_compute(blocks, seq)
    assert len(seq.block_table) == 1
    seq.output_ids.append(7)  # position 4 starts a second block
    assert blocks.can_append(seq)
    blocks.append_slot(seq)
    assert len(seq.block_table) == 2
    seq.num_computed += 1
    seq.output_ids.append(8)
    blocks.append_slot(seq)  # position 5 fits in the second block
    assert len(seq.block_table) == 2


def test_cannot_append_when_the_pool_is_empty():
    blocks = BlockManager(2, 4)
    seq = make_seq(range(8))
    admit_and_compute(blocks, seq)
    seq.output_ids.append(1)
    assert not blocks.can_append(seq)


def test_prefix_hit_shares_blocks_copy_free():
    blocks = BlockManager(16, 4)
    first = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0)
    admit_and_compute(blocks, first)
    second = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 99, 98, 97], 1)
    hits = admit_and_compute(blocks, second)
    assert hits == first.block_table[:2]
    assert second.block_table[:2] == first.block_table[:2] and second.block_table[2] != first.block_table[2]
    assert [blocks.ref_counts[b] for b in hits] == [2, 2]
    assert second.num_prefix_hit_tokens == 8
    assert blocks.prefix_hit_pct == pytest.approx(100 * 8 / 21)


def test_a_preempted_sequence_finding_its_own_blocks_is_no_prefix_hit():
    blocks = BlockManager(16, 4)
    seq = make_seq(range(10))
    admit_and_compute(blocks, seq)
    seq.output_ids += [50, 51, 52]
    seq.num_computed += 2
    blocks.append_slot(seq, 2)
    blocks.cache_full_blocks(seq)  # 12 computed: 3 full blocks cached
    blocks.free(seq)  # preempted, as Scheduler.preempt does
    seq.num_computed, seq.num_preemptions = 0, 1
    assert len(admit_and_compute(blocks, seq)) == 3  # the recompute finds its blocks...
    assert seq.num_prefix_hit_tokens == 0 and blocks.prefix_hit_pct == 0  # ...but its prompt shared nothing


def test_the_block_holding_the_last_prompt_token_is_never_shared():
    blocks = BlockManager(16, 4)
    admit_and_compute(blocks, make_seq(range(8), 0))
    again = make_seq(range(8), 1)
    assert len(blocks.prefix_hits(again)) == 1  # the second block holds the last token: computed again


def test_hits_stop_at_the_first_differing_block_even_if_later_blocks_match():
    blocks = BlockManager(16, 4)
    admit_and_compute(blocks, make_seq([1, 2, 3, 4, 5, 6, 7, 8, 0], 0))
    other = make_seq([9, 9, 9, 9, 5, 6, 7, 8, 0], 1)  # same second block after a different first one
    assert blocks.prefix_hits(other) == []


def test_a_hit_checks_token_ids_not_only_the_hash():
    blocks = BlockManager(16, 4)
    first = make_seq([1, 2, 3, 4, 5], 0)
    admit_and_compute(blocks, first)
    blocks.block_tokens[first.block_table[0]] = (1, 2, 3, 999)  # as if two token lists had collided
    assert blocks.prefix_hits(make_seq([1, 2, 3, 4, 5], 1)) == []


def test_prefix_caching_off_never_hits():
    blocks = BlockManager(16, 4, enable_prefix_caching=False)
    admit_and_compute(blocks, make_seq(range(9), 0))
    assert blocks.prefix_hits(make_seq(range(9), 1)) == [] and not blocks.cached


def test_freed_cached_blocks_are_revived_and_count_against_the_free_pool():
    blocks = BlockManager(3, 4)
    first = make_seq(range(9), 0)
    admit_and_compute(blocks, first)
    table = list(first.block_table)
    blocks.free(first)
    assert blocks.num_free_blocks == 3 and len(blocks.free_cached) == 2
    again = make_seq(range(9), 1)
    hits = blocks.prefix_hits(again)
    assert hits == table[:2]
    assert blocks.can_allocate(again, hits, 1) and not blocks.can_allocate(again, hits, 5)
    blocks.allocate(again, hits, 1)
    assert blocks.num_free_blocks == 0 and again.num_computed == 8


def test_uncached_blocks_are_reused_before_cached_ones_and_cached_ones_in_lru_order():
    blocks = BlockManager(4, 2)
    old = make_seq([1, 2, 3], 0)
    admit_and_compute(blocks, old)  # blocks: [1 2] registered, [3] not
    old_cached = old.block_table[0]
    blocks.free(old)
    newer = make_seq([7, 8, 9], 1)
    admit_and_compute(blocks, newer)
    newer_cached = newer.block_table[0]
    blocks.free(newer)
    assert old_cached not in newer.block_table  # the uncached blocks went first
    fresh = make_seq([5, 5, 5, 5, 5, 5, 5], 2)
    blocks.allocate(fresh, [], 5)  # three blocks: two uncached, then the least recently freed cached one
    assert old_cached in fresh.block_table and newer_cached not in fresh.block_table
    assert blocks.prefix_hits(make_seq([1, 2, 3], 3)) == []  # evicted
    assert blocks.prefix_hits(make_seq([7, 8, 9], 4)) == [newer_cached]


def test_shared_block_is_freed_only_when_its_last_user_leaves():
    blocks = BlockManager(8, 4)
    first, second = make_seq(range(9), 0), make_seq(range(9), 1)
    admit_and_compute(blocks, first)
    admit_and_compute(blocks, second)
    shared = first.block_table[0]
    blocks.free(first)
    assert blocks.ref_counts[shared] == 1 and shared not in blocks.free_cached
    blocks.free(second)
    assert blocks.ref_counts[shared] == 0 and blocks.num_free_blocks == 8


def test_bad_pool_size_is_refused():
    with pytest.raises(ValueError, match="positive pool"):
        BlockManager(0, 16)
