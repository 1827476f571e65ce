"""Scheduler: decode priority, chunked prefill, max_num_seqs, preemption, aging, static batching."""

import numpy as np
import pytest

from infc.compiler.runtime.block_manager import BlockManager
from infc.compiler.runtime.sampler import SamplingParams
from infc.compiler.runtime.scheduler import Scheduler
from infc.compiler.runtime.scheduler_config import SchedulerConfig
from infc.compiler.runtime.sequence import Sequence, Status


def make_scheduler(num_blocks=64, block_size=4, prefix_caching=True, **config):
    return Scheduler(SchedulerConfig(**config), BlockManager(num_blocks, block_size, prefix_caching))


def add(scheduler, prompt_len, seq_id, first_token=0):
    seq = Sequence(seq_id, list(range(first_token, first_token + prompt_len)), SamplingParams(), np.random.default_rng(0))
    scheduler.add(seq)
    return seq


def run_step(scheduler, next_token=1):
    """schedule -> (no model) -> commit and append a token to every sequence whose chunk ended its tokens."""
    scheduled = scheduler.schedule()
    sampling = [seq for seq, n in scheduled if seq.num_computed + n == seq.num_tokens]
    scheduler.commit(scheduled)
    for seq in sampling:
        seq.output_ids.append(next_token)
    return {seq.seq_id: n for seq, n in scheduled}


def test_long_prompt_is_chunked_over_several_steps():
    scheduler = make_scheduler(max_num_seqs=4, max_num_batched_tokens=8)
    seq = add(scheduler, 20, 0)
    assert [run_step(scheduler) for _ in range(4)] == [{0: 8}, {0: 8}, {0: 4}, {0: 1}]
    assert seq.output_ids == [1, 1] and seq.num_prefill_tokens == 20


def test_running_decodes_come_first_and_the_prefill_gets_what_is_left():
    scheduler = make_scheduler(max_num_seqs=4, max_num_batched_tokens=8)
    decoders = [add(scheduler, 2, i, first_token=10 * i) for i in range(3)]
    assert run_step(scheduler) == {0: 2, 1: 2, 2: 2}
    add(scheduler, 30, 3, first_token=100)
    for _ in range(3):
        step = run_step(scheduler)
        assert [step[s.seq_id] for s in decoders] == [1, 1, 1]  # never starved
        assert step[3] == 5  # 8 - 3 decodes


def test_max_num_seqs_bounds_the_running_set():
    scheduler = make_scheduler(max_num_seqs=2, max_num_batched_tokens=64)
    for i in range(4):
        add(scheduler, 3, i, first_token=10 * i)
    assert set(run_step(scheduler)) == {0, 1}
    assert len(scheduler.running) == 2 and len(scheduler.waiting) == 2


def test_newest_is_preempted_when_blocks_run_out_and_nothing_is_admitted_that_step():
    # growth_lookahead 0: admission leaves only the watermark, so the pool can run out
    scheduler = make_scheduler(num_blocks=4, block_size=4, max_num_seqs=4, max_num_batched_tokens=64, growth_lookahead=0)
    old, new = add(scheduler, 8, 0), add(scheduler, 7, 1, first_token=50)
    assert run_step(scheduler) == {0: 8, 1: 7}  # 2 + 2 blocks: the pool is full
    waiting = add(scheduler, 1, 2, first_token=90)
    step = run_step(scheduler)  # old needs a third block: the newest running one goes
    assert step == {0: 1} and scheduler.num_preemptions == 1
    assert new.status is Status.WAITING and new.num_computed == 0 and new.block_table == []
    assert list(scheduler.waiting) == [new, waiting]  # the preempted one goes back first
    assert waiting.status is Status.WAITING  # no admission in a step that preempted


def test_a_sequence_preempts_itself_when_it_is_the_newest():
    scheduler = make_scheduler(num_blocks=2, block_size=4, max_num_seqs=4, max_num_batched_tokens=64)
    seq = add(scheduler, 8, 0)
    run_step(scheduler)
    assert run_step(scheduler) == {} and seq.status is Status.WAITING


def test_aging_stops_overtaking_after_max_skip_steps():
    scheduler = make_scheduler(num_blocks=6, block_size=4, max_num_seqs=8, max_num_batched_tokens=64, max_skip_steps=2,
                               growth_lookahead=0)
    add(scheduler, 16, 0)  # 4 blocks, stays running
    run_step(scheduler)
    big = add(scheduler, 12, 1, first_token=100)  # needs 3 blocks, only 2 free
    admitted = []
    for i in range(4):
        small = add(scheduler, 2, 2 + i, first_token=200 + 10 * i)
        step = run_step(scheduler)
        admitted.append(small.seq_id in step)
        if small.seq_id in step:
            scheduler.finish(small, "stop")
    assert admitted == [True, True, False, False] and big.skipped_steps == 2


def test_static_batching_admits_nothing_until_the_whole_batch_is_done():
    scheduler = make_scheduler(max_num_seqs=2, max_num_batched_tokens=64, static_batching=True)
    a, b, c = add(scheduler, 3, 0), add(scheduler, 3, 1, first_token=10), add(scheduler, 3, 2, first_token=20)
    assert set(run_step(scheduler)) == {0, 1}
    scheduler.finish(a, "stop")
    assert set(run_step(scheduler)) == {1}  # a free slot, yet c waits
    scheduler.finish(b, "stop")
    assert set(run_step(scheduler)) == {2}


def test_finish_and_cancel_free_blocks_at_once():
    scheduler = make_scheduler(num_blocks=8, max_num_seqs=4, max_num_batched_tokens=64)
    running, waiting = add(scheduler, 9, 0), add(scheduler, 40, 1, first_token=100)
    run_step(scheduler)
    assert scheduler.blocks.num_free_blocks == 5
    scheduler.finish(running, "cancelled")
    scheduler.finish(waiting, "cancelled")
    assert scheduler.blocks.num_free_blocks == 8 and not scheduler.has_work()
    assert running.finish_reason == "cancelled" and waiting.is_finished


def test_a_sequence_whose_prefix_is_being_computed_waits_for_the_hit():
    scheduler = make_scheduler(num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=8)
    first = add(scheduler, 16, 0)
    second = add(scheduler, 18, 1)  # same first 16 tokens
    assert run_step(scheduler) == {0: 8}  # second is not admitted to compute the same blocks
    assert run_step(scheduler) == {0: 8}
    assert run_step(scheduler) == {0: 1, 1: 2}  # its first 16 tokens are hits
    assert second.num_prefix_hit_tokens == 16 and second.num_prefill_tokens == 2


def test_config_must_let_every_decode_fit():
    with pytest.raises(ValueError, match="every running decode fits"):
        SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=8)


def test_static_batch_reserves_each_members_full_length_in_the_pool():
    # 8 blocks of 4 tokens; each request needs ceil((3 + 10) / 4) = 4 blocks at full length, so a
    # static batch holds two of them even though max_num_seqs allows three
    scheduler = make_scheduler(num_blocks=8, max_num_seqs=3, max_num_batched_tokens=64, static_batching=True)
    seqs = [add(scheduler, 3, i, first_token=10 * i) for i in range(3)]
    for seq in seqs:
        seq.params = SamplingParams(max_tokens=10)
    assert set(run_step(scheduler)) == {0, 1}
    assert seqs[2].status is Status.WAITING


def test_static_batch_pads_every_member_to_its_longest():
    # 12 blocks of 4 tokens: a short request (3 + 2 -> 2 blocks) joins a long one (3 + 17 -> 5
    # blocks) only at the long one's length, as one [batch, length] cache: 2 x 5 blocks fit, 3 x 5 not
    scheduler = make_scheduler(num_blocks=12, max_num_seqs=4, max_num_batched_tokens=64, static_batching=True)
    seqs = [add(scheduler, 3, i, first_token=10 * i) for i in range(3)]
    for seq, max_tokens in zip(seqs, (17, 2, 2)):
        seq.params = SamplingParams(max_tokens=max_tokens)
    assert set(run_step(scheduler)) == {0, 1}
    assert seqs[2].status is Status.WAITING


def test_admission_keeps_the_watermark_free_while_others_run():
    scheduler = make_scheduler(num_blocks=20, block_size=4, max_num_seqs=4, max_num_batched_tokens=64, watermark=0.25)
    add(scheduler, 39, 0)  # 10 blocks (also with its first output token): an idle pool admits it
    assert run_step(scheduler) == {0: 39}
    add(scheduler, 20, 1, first_token=100)  # 5 more would leave 5 free, the watermark wants 5: fits
    add(scheduler, 4, 2, first_token=200)  # 1 more would leave 4 free: waits
    assert run_step(scheduler) == {0: 1, 1: 20}


def test_admission_leaves_room_for_the_running_sequences_to_grow():
    # 20 blocks of 4 tokens; the running sequence (8 prompt tokens, 40 to go) will grow by 32 tokens
    # = 8 blocks over the lookahead, so a newcomer needing 10 more blocks waits (2 + 10 + 8 > 20)
    scheduler = make_scheduler(num_blocks=20, block_size=4, max_num_seqs=4, max_num_batched_tokens=64, growth_lookahead=32)
    first = add(scheduler, 8, 0)
    first.params = SamplingParams(max_tokens=40)
    assert run_step(scheduler) == {0: 8}
    add(scheduler, 39, 1, first_token=100)
    assert run_step(scheduler) == {0: 1}
    relaxed = make_scheduler(num_blocks=20, block_size=4, max_num_seqs=4, max_num_batched_tokens=64, growth_lookahead=0)
    first = add(relaxed, 8, 0)
    first.params = SamplingParams(max_tokens=40)
    run_step(relaxed)
    add(relaxed, 39, 1, first_token=100)
    assert run_step(relaxed) == {0: 1, 1: 39}


def test_prefill_cap_limits_prefill_tokens_only_in_steps_with_decodes():
    scheduler = make_scheduler(max_num_seqs=4, max_num_batched_tokens=64)
    seen = []
    scheduler.prefill_cap = lambda contexts, start: seen.append((list(contexts), start)) or (5 * len(contexts) if contexts else None)
    add(scheduler, 3, 0)
    assert run_step(scheduler) == {0: 3}
    add(scheduler, 30, 1, first_token=100)
    assert run_step(scheduler) == {0: 1, 1: 5}  # one decode: at most 5 prefill tokens
    assert seen[-1] == ([4], 0)  # the decode at position 3 attends 4 positions; the prompt starts at 0
    assert run_step(scheduler) == {0: 1, 1: 5}
    assert seen[-1] == ([5], 5)  # the running prompt's next chunk starts at 5
    scheduler.finish(scheduler.running[0], "stop")
    assert run_step(scheduler) == {1: 20}  # no decodes left: the whole budget
