"""The scheduler's knobs (scheduler.py): batch limits, static batching, aging and the admission watermark."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    static_batching: bool = False
    max_skip_steps: int = 8
    # Admission leaves this share of the pool free for the running sequences to grow into: admitting
    # into the last blocks only to preempt (and recompute) someone a few steps later is pure loss.
    watermark: float = 0.05

    def __post_init__(self):
        if self.max_num_seqs <= 0 or self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"need 0 < max_num_seqs ({self.max_num_seqs}) <= max_num_batched_tokens "
                             f"({self.max_num_batched_tokens}) so every running decode fits in a step")
