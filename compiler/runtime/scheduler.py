"""Iteration-level scheduling: which sequences run in the next step, and how many tokens each.

A step first serves the running sequences, decodes before prefill chunks, so a long prompt only
gets the token budget the decodes leave (running decodes are never starved). Then, unless the step
had to preempt, it admits waiting sequences first come first served into what is left, chunking a
prompt that does not fit. A waiting sequence that cannot be admitted may be overtaken by later
ones for `max_skip_steps` steps (aging); after that nothing passes it until it fits. When blocks run
out the newest running sequence is preempted: its blocks are freed and it is recomputed later
(its computed blocks stay in the prefix cache, so the recompute is mostly cache hits).

Decode priority: when the engine sets `prefill_cap` (step_cost.py), a step that carries decodes
takes at most that many prefill tokens, so a long prompt cannot stretch the running requests'
inter-token latency beyond a set factor of a decode-only step.

Static batching (the baseline): a batch is formed when the previous one has finished, of up to
`max_num_seqs` waiting sequences first come first served, as many as the free pool holds as one
contiguous cache: every member reserves the longest member's prompt + max_tokens (a static batch
cannot preempt, so it reserves its worst case, and a [batch, length] KV tensor pads to its longest
row); nothing else is admitted until all of its members finish. Finished members stop computing.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from .block_manager import BlockManager
from .scheduler_config import SchedulerConfig
from .sequence import Sequence, Status


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        self.config, self.blocks = config, block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.static_batch: set[Sequence] = set()
        self.num_preemptions = 0
        # (decode context lengths, prefill start) -> most prefill tokens in a step with decodes
        self.prefill_cap: Callable[[list[int], int], int | None] | None = None

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[tuple[Sequence, int]]:
        """The next step's work: (sequence, number of its tokens to feed), in that order."""
        budget = self.config.max_num_batched_tokens
        scheduled: dict[Sequence, int] = {}
        num_preemptions = self.num_preemptions
        decodes_first = sorted(self.running, key=lambda s: s.num_uncomputed > 1)  # stable: oldest first
        is_capped = False
        for seq in decodes_first:
            if not is_capped and seq.num_uncomputed > 1:
                budget, is_capped = self._capped(budget, scheduled, seq.num_computed), True
            num_new = min(seq.num_uncomputed, budget)
            if seq.status is not Status.RUNNING or num_new == 0:
                continue
            while not self.blocks.can_append(seq, num_new):
                victim = self.running[-1]  # newest first
                self.preempt(victim)
                budget += scheduled.pop(victim, 0)
                if victim is seq:
                    break
            if seq.status is Status.RUNNING:
                self.blocks.append_slot(seq, num_new)
                scheduled[seq] = num_new
                budget -= num_new
        if self.num_preemptions == num_preemptions:
            self._admit(scheduled, budget if is_capped else self._capped(budget, scheduled, 0))
        return list(scheduled.items())

    def _keep_free(self) -> int:
        """Blocks admission leaves free: the running sequences' next `growth_lookahead` output
        tokens each (this step's are allocated already), at least the watermark."""
        if self.config.static_batching or not self.running:  # a static batch reserved its worst case
            return 0
        lookahead = self.config.growth_lookahead
        growth = sum(min(lookahead, len(seq.prompt_ids) + seq.params.max_tokens - seq.num_tokens) for seq in self.running)
        return max(int(self.config.watermark * self.blocks.num_blocks), -(-growth // self.blocks.block_size))

    def _capped(self, budget: int, decodes: dict[Sequence, int], start: int) -> int:
        """The token budget left for prefill chunks starting at position `start` after the step's
        `decodes` (decode priority)."""
        cap = self.prefill_cap([seq.num_computed + 1 for seq in decodes], start) if self.prefill_cap else None
        return budget if cap is None else min(budget, cap)

    def _static_batch(self) -> set[Sequence]:
        """FCFS members while the batch's contiguous cache fits: every member reserves the longest
        member's prompt + max_tokens, as a [batch, length] KV tensor does."""
        batch, longest = set(), 0
        for seq in self.waiting:
            length = max(longest, len(seq.prompt_ids) + seq.params.max_tokens)
            need = (len(batch) + 1) * self.blocks.blocks_for(length)
            if len(batch) == self.config.max_num_seqs or batch and need > self.blocks.num_free_blocks:
                break
            batch.add(seq)
            longest = length
        return batch

    def _admit(self, scheduled: dict[Sequence, int], budget: int) -> None:
        if self.config.static_batching and not self.static_batch and not self.running:
            self.static_batch = self._static_batch()
        passed_over: list[Sequence] = []
        for seq in list(self.waiting):
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs or self.blocks.num_free_blocks == 0:
                break
            if self.config.static_batching and seq not in self.static_batch:
                break
            hits = self.blocks.prefix_hits(seq)
            num_new = min(seq.num_tokens - len(hits) * self.blocks.block_size, budget)
            if self._prefix_in_flight(seq, len(hits)) or not self.blocks.can_allocate(seq, hits, num_new, self._keep_free()):
                if seq.skipped_steps >= self.config.max_skip_steps:
                    break  # aged: nobody overtakes it any more
                passed_over.append(seq)
                continue
            self.waiting.remove(seq)
            self.blocks.allocate(seq, hits, num_new)
            seq.status = Status.RUNNING
            self.running.append(seq)
            scheduled[seq] = num_new
            budget -= num_new
            for earlier in passed_over:
                earlier.skipped_steps += 1

    def _prefix_in_flight(self, seq: Sequence, num_hits: int) -> bool:
        """Whether a running sequence is computing this one's next full block right now: waiting
        until it is registered turns the block into a hit instead of computing it twice."""
        if not self.blocks.enable_prefix_caching or num_hits >= len(seq.block_hashes):
            return False
        wanted = seq.block_hashes[num_hits]
        return any(other.num_cached_blocks <= num_hits < len(other.block_hashes)
                   and other.block_hashes[num_hits] == wanted and other.num_uncomputed > 1
                   for other in self.running)

    def commit(self, scheduled: list[tuple[Sequence, int]]) -> None:
        """After the runner's step: the scheduled tokens' K/V is now in the cache."""
        for seq, num_new in scheduled:
            is_decode = num_new == 1 and seq.output_ids and seq.num_computed == seq.num_tokens - 1
            seq.num_prefill_tokens += 0 if is_decode else num_new
            seq.num_computed += num_new
            self.blocks.cache_full_blocks(seq)

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.num_computed = 0
        seq.num_preemptions += 1
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence, reason: str) -> None:
        """Stop a sequence (done, or cancelled) and free its blocks at once."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING:
            self.waiting.remove(seq)
        self.blocks.free(seq)
        self.static_batch.discard(seq)
        seq.status, seq.finish_reason = Status.FINISHED, reason
