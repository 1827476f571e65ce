"""Decode priority: how many prefill tokens a step that carries decodes may take, so that the
running requests' inter-token latency stays within a factor of a decode-only step.

A step's time is close to linear in two things: the tokens it feeds (GEMMs, norms: the same work
per token) and the positions their attention reads (each token attends to its whole context):
    t = fixed + per_token * tokens + per_position * attended
where `attended` is the sum over the step's tokens of their context lengths. The fixed part is
reading the weights, launching kernels, Python. Without the attention term a fit underrates the
late chunks of a long prompt, which attend over thousands of positions each, and they overshoot
the factor. The model is fitted online, by least squares over the most recent steps, from the
engine's own clock, so it follows the machine it runs on.

With decodes of contexts c_1..c_d, a decode-only step takes T0 = fixed + per_token * d +
per_position * sum(c_i). A prefill chunk of p tokens starting at position s adds
per_token * p + per_position * (p * s + p * (p + 1) / 2); the cap is the largest p that keeps the
step within `factor` * T0.

Until the recent steps span a spread of sizes (a fit needs different token counts), the cap is
`cold_cap` tokens, so a server that has only decoded so far does not stall on its first long prompt.
When the positions cannot be told apart from the tokens (every step attends alike), the fit drops
the attention term.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Sequence

import numpy as np

WINDOW = 256  # recent steps the fit uses: enough to average noise, few enough to follow load changes
MIN_SPREAD = 2.0  # the largest step of the window has at least this many times the tokens of the smallest


def attended_positions(chunks: Sequence[tuple[int, int]]) -> int:
    """Positions read by attention in a step of (start, num_new) chunks: token i of a chunk sees start + i + 1."""
    return sum(n * start + n * (n + 1) // 2 for start, n in chunks)


class StepCostModel:
    def __init__(self, factor: float, cold_cap: int, min_cap: int = 1):
        if factor <= 1:
            raise ValueError(f"the inter-token latency factor must be above 1, got {factor}")
        self.factor, self.cold_cap, self.min_cap = factor, cold_cap, min_cap
        self.samples: deque[tuple[int, int, float]] = deque(maxlen=WINDOW)

    def observe(self, num_tokens: int, seconds: float, attended: int = 0) -> None:
        if num_tokens > 0 and seconds >= 0:
            self.samples.append((num_tokens, attended, seconds))

    def fit(self) -> tuple[float, float, float] | None:
        """(fixed seconds, seconds per token, seconds per attended position), or None while the
        window cannot tell fixed and per-token cost apart."""
        if len(self.samples) < 2:
            return None
        data = np.array(self.samples, np.float64)
        tokens, attended, seconds = data[:, 0], data[:, 1], data[:, 2]
        if tokens.max() < MIN_SPREAD * tokens.min():
            return None
        ones = np.ones_like(tokens)
        full = np.stack([ones, tokens, attended], axis=1)
        if np.linalg.matrix_rank(full) == 3:
            (fixed, per_token, per_position), *_ = np.linalg.lstsq(full, seconds, rcond=None)
            if per_token > 0 and per_position >= 0:
                return max(0.0, fixed), per_token, per_position
        (fixed, per_token), *_ = np.linalg.lstsq(full[:, :2], seconds, rcond=None)
        if per_token <= 0:
            return None  # noise swamps the size dependence: no basis for a cap
        return max(0.0, fixed), per_token, 0.0

    def prefill_cap(self, decode_contexts: Sequence[int], start: int = 0) -> int | None:
        """Most prefill tokens for a step whose decodes have these context lengths (None: no
        decodes, no cap), the prefill starting at position `start`."""
        if not decode_contexts:
            return None
        fit = self.fit()
        if fit is None:
            return self.cold_cap
        fixed, per_token, per_position = fit
        decode_only_s = fixed + per_token * len(decode_contexts) + per_position * sum(decode_contexts)
        allowed_s = (self.factor - 1) * decode_only_s
        linear = per_token + per_position * (start + 0.5)
        if per_position == 0:
            tokens = allowed_s / linear
        else:  # per_position / 2 * p^2 + linear * p = allowed_s
            tokens = (math.sqrt(linear * linear + 2 * per_position * allowed_s) - linear) / per_position
        return max(self.min_cap, int(tokens))
