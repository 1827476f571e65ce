"""The scheduler's knobs (scheduler.py): batch limits, static batching, aging and the admission watermark."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    static_batching: bool = False
    max_skip_steps: int = 8
    # Admission leaves room for the running sequences to grow into: this share of the pool, or their
    # next `growth_lookahead` tokens each if more. Admitting into the last blocks only to preempt (and
    # recompute) someone a few steps later is pure loss; on a CPU, where a recomputed token costs as
    # much as a decoded one, 32 tokens measured best (bench/decode.py, same-KV-budget comparison).
    watermark: float = 0.05
    growth_lookahead: int = 32

    def __post_init__(self):
        if self.max_num_seqs <= 0 or self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"need 0 < max_num_seqs ({self.max_num_seqs}) <= max_num_batched_tokens "
                             f"({self.max_num_batched_tokens}) so every running decode fits in a step")
