"""The paged KV pool's bookkeeping: fixed-size blocks, a free list, reference counts, and a prefix
cache keyed by a chained hash of full blocks.

A full block whose K/V has been computed is registered under hash(parent hash, its token ids), so
a later sequence starting with the same tokens shares it copy-free (the token ids are compared on a
hit; a hash alone is never trusted). Blocks are registered only after the step that computed them,
so no sequence ever reads K/V that is still being written. A freed block keeps its registration and
waits in a least-recently-used queue; blocks that hold nothing reusable are handed out first.

Invariant: only full blocks before a sequence's last token are shared, so the block a sequence
writes into is always its own and no copy-on-write is needed.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from .sequence import Sequence


def chain_hash(parent: int, block_token_ids: tuple[int, ...]) -> int:
    return hash((parent, block_token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"need a positive pool, got {num_blocks} blocks of {block_size} tokens")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # chained hash -> block id
        self.free_uncached: deque[int] = deque(range(num_blocks))
        self.free_cached: OrderedDict[int, None] = OrderedDict()  # least recently freed first
        self.num_hit_tokens = 0
        self.num_query_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_uncached) + len(self.free_cached)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def compute_hashes(self, seq: Sequence, num_full_blocks: int, token_ids: list[int]) -> None:
        size = self.block_size
        for i in range(len(seq.block_hashes), num_full_blocks):
            parent = seq.block_hashes[i - 1] if i else 0
            seq.block_hashes.append(chain_hash(parent, tuple(token_ids[i * size:(i + 1) * size])))

    def prefix_hits(self, seq: Sequence) -> list[int]:
        """Cached blocks holding this sequence's leading full blocks (never the one with its last token)."""
        if not self.enable_prefix_caching:
            return []
        token_ids, size = seq.token_ids, self.block_size
        num_shareable = (len(token_ids) - 1) // size
        self.compute_hashes(seq, num_shareable, token_ids)
        hits = []
        for i in range(num_shareable):
            block = self.cached.get(seq.block_hashes[i])
            if block is None or self.block_tokens[block] != tuple(token_ids[i * size:(i + 1) * size]):
                break
            hits.append(block)
        return hits

    def can_allocate(self, seq: Sequence, hits: list[int], num_new: int, keep_free: int = 0) -> bool:
        """Whether the sequence's cached prefix and next num_new tokens fit, leaving keep_free blocks."""
        num_fresh = self.blocks_for(len(hits) * self.block_size + num_new) - len(hits)
        num_revived = sum(1 for b in hits if self.ref_counts[b] == 0)  # these leave the free queue
        return num_fresh + num_revived + keep_free <= self.num_free_blocks

    def allocate(self, seq: Sequence, hits: list[int], num_new: int) -> None:
        """Admit a sequence: share its cached prefix, then take blocks for its next num_new tokens."""
        assert not seq.block_table and self.can_allocate(seq, hits, num_new)
        for block in hits:
            if self.ref_counts[block] == 0:
                del self.free_cached[block]
            self.ref_counts[block] += 1
        seq.block_table = list(hits)
        seq.num_cached_blocks = len(hits)
        seq.num_computed = len(hits) * self.block_size
        # The hit rate is the share of prompt tokens found in the cache, counted at a sequence's
        # first admission: a preempted one finds its own blocks again (with its output tokens),
        # which saves recompute (prefill_tokens shows it) but must not read as prefix sharing.
        if seq.num_preemptions == 0:
            seq.num_prefix_hit_tokens = seq.num_computed
            self.num_hit_tokens += seq.num_computed
            self.num_query_tokens += seq.num_tokens
        self.append_slot(seq, num_new)

    def can_append(self, seq: Sequence, num_new: int = 1) -> bool:
        return self.blocks_for(seq.num_computed + num_new) - len(seq.block_table) <= self.num_free_blocks

    def append_slot(self, seq: Sequence, num_new: int = 1) -> None:
        """Grow the block table to cover the next num_new tokens (one for a decode step)."""
        for _ in range(self.blocks_for(seq.num_computed + num_new) - len(seq.block_table)):
            seq.block_table.append(self._take_free_block())

    def _take_free_block(self) -> int:
        if self.free_uncached:
            block = self.free_uncached.popleft()
        else:  # evict the least recently used cached block
            block, _ = self.free_cached.popitem(last=False)
            if self.cached.get(self.block_hash[block]) == block:
                del self.cached[self.block_hash[block]]
            self.block_hash[block] = self.block_tokens[block] = None
        self.ref_counts[block] = 1
        return block

    def cache_full_blocks(self, seq: Sequence) -> None:
        """After a step: register the blocks this sequence has completely computed."""
        num_full = seq.num_computed // self.block_size
        if not self.enable_prefix_caching or num_full <= seq.num_cached_blocks:
            return
        token_ids, size = seq.token_ids, self.block_size
        self.compute_hashes(seq, num_full, token_ids)
        for i in range(seq.num_cached_blocks, num_full):
            block, block_hash = seq.block_table[i], seq.block_hashes[i]
            if block_hash not in self.cached and self.block_hash[block] is None:
                self.cached[block_hash] = block
                self.block_hash[block] = block_hash
                self.block_tokens[block] = tuple(token_ids[i * size:(i + 1) * size])
        seq.num_cached_blocks = num_full

    def free(self, seq: Sequence) -> None:
        # Tail first: the tail is the least likely to be shared, so it is the first to be evicted.
        for block in reversed(seq.block_table):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                if self.block_hash[block] is None:
                    self.free_uncached.append(block)
                else:
                    self.free_cached[block] = None
        seq.block_table = []
        seq.num_cached_blocks = 0

    @property
    def prefix_hit_pct(self) -> float:
        return 100.0 * self.num_hit_tokens / self.num_query_tokens if self.num_query_tokens else 0.0
