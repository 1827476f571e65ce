"""Token sampling: greedy, temperature, top-k, top-p. Every request samples from its own seeded
generator and its own logits row, so its tokens never depend on what else is in the batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0 (or -1, vLLM's older spelling): no limit
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()

    def problem(self) -> str | None:
        """Why these parameters cannot be served (None when they can)."""
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            return f"max_tokens must be a positive integer, got {self.max_tokens!r}"
        if not self.temperature >= 0:
            return f"temperature must be >= 0, got {self.temperature!r}"
        if not isinstance(self.top_k, int) or self.top_k < -1:
            return f"top_k must be an integer >= 0 (or -1: no limit), got {self.top_k!r}"
        if not 0 < self.top_p <= 1:
            return f"top_p must be in (0, 1], got {self.top_p!r}"
        if self.seed is not None and not (isinstance(self.seed, int) and self.seed >= 0):
            return f"seed must be an integer >= 0, got {self.seed!r}"  # what NumPy's generators take
        return None


def make_generator(params: SamplingParams, base_seed: int, request_index: int) -> np.random.Generator:
    # Without a seed of its own a request still gets a reproducible stream, distinct from the others'.
    return np.random.default_rng(params.seed if params.seed is not None else [base_seed, request_index])


def sample_token(logits_V: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    if params.temperature == 0:
        return int(np.argmax(logits_V))
    scaled_V = logits_V.astype(np.float64) / params.temperature
    candidates = np.arange(scaled_V.shape[0])
    if 0 < params.top_k < scaled_V.shape[0]:
        # argpartition's order is unspecified: sort the survivors by id so the result is stable.
        candidates = np.sort(np.argpartition(-scaled_V, params.top_k - 1)[:params.top_k])
    kept = scaled_V[candidates]
    probs = np.exp(kept - kept.max())
    probs /= probs.sum()
    if params.top_p < 1:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        num_kept = int(np.searchsorted(cumulative, params.top_p) + 1)
        chosen = np.sort(order[:num_kept])
        candidates, probs = candidates[chosen], probs[chosen] / probs[chosen].sum()
    index = int(np.searchsorted(np.cumsum(probs), rng.random() * probs.sum(), side="right"))
    return int(candidates[min(index, len(candidates) - 1)])


def sample_batch(logits_NV: np.ndarray, params: list[SamplingParams], rngs: list[np.random.Generator]) -> list[int]:
    """One token per logits row; greedy rows take one vectorized argmax."""
    if logits_NV.shape[0] != len(params):
        raise ValueError(f"runner returned {logits_NV.shape[0]} logits rows for {len(params)} sequences")
    greedy = np.argmax(logits_NV, axis=-1) if len(params) else []
    return [int(greedy[i]) if p.temperature == 0 else sample_token(logits_NV[i], p, rngs[i])
            for i, p in enumerate(params)]
