"""The contract between the decode loop (scheduler, block manager, sampler, engine) and the model
runner that executes a decoder plan over the paged KV cache. Both sides code against this file.

One engine step hands the runner a list of chunks, one per scheduled sequence: a prefill chunk
(many tokens) or a decode token (one). The runner runs them as ONE forward pass over a flat batch
of tokens (every GEMM sees M = total tokens), writes each token's K/V into the block pool slots the
block table gives, attends through the block tables, and returns logits only for the chunks that
need them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np


@dataclass(frozen=True)
class SeqChunk:
    seq_id: int
    token_ids: Sequence[int]  # the tokens fed this step
    start_pos: int  # position of token_ids[0]; also the number of this sequence's tokens already in the cache
    block_table: Sequence[int]  # physical block ids covering positions [0, start_pos + len(token_ids))
    needs_logits: bool  # the chunk ends the prompt or is a decode token: the engine samples from it


@dataclass(frozen=True)
class ModelSpec:
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    block_size: int = 16


KV_DTYPE = np.float32  # the block pools' element type (runtime/model_runner.py)


def host_free_bytes() -> int:
    """Free host memory: what a KV pool on the CPU may take a share of (engine.pool_size)."""
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def kv_bytes_per_block(spec: ModelSpec) -> int:
    """A block's K and V over every layer: what one block of the pool costs."""
    return 2 * spec.num_layers * spec.num_kv_heads * spec.block_size * spec.head_dim * np.dtype(KV_DTYPE).itemsize


class ModelRunner(Protocol):
    spec: ModelSpec

    def allocate_kv(self, num_blocks: int) -> None:
        """Allocate the block pool once: per layer K and V of [num_blocks, num_kv_heads, block_size, head_dim]."""

    def kv_bytes_per_block(self) -> int: ...

    def step(self, chunks: Sequence[SeqChunk]) -> np.ndarray:
        """One forward pass; returns float32 logits [number of chunks with needs_logits, vocab_size] in
        chunk order. The result for a chunk depends only on that sequence's tokens and cache (batch
        invariant), never on what else is in the batch."""
