"""Decode priority: how many prefill tokens a step that carries decodes may take, so that the
running requests' inter-token latency stays within a factor of a decode-only step.

A step's time is close to linear in its tokens: t = fixed + per_token * tokens (the fixed part is
reading the weights, launching kernels, Python). The model is fitted online, by least squares over
the most recent steps, from the engine's own clock, so it follows the machine it runs on. With d
decodes in a step, a decode-only step takes fixed + per_token * d, and allowing `p` prefill tokens
keeps the step within `factor` of that when p <= (factor - 1) * (fixed + per_token * d) / per_token.

Until the recent steps span a spread of sizes (a fit needs two different token counts), the cap is
`cold_cap` tokens, so a server that has only decoded so far does not stall on its first long prompt.
"""

from __future__ import annotations

from collections import deque

WINDOW = 256  # recent steps the fit uses: enough to average noise, few enough to follow load changes
MIN_SPREAD = 2.0  # the largest step of the window has at least this many times the tokens of the smallest


class StepCostModel:
    def __init__(self, factor: float, cold_cap: int, min_cap: int = 1):
        if factor <= 1:
            raise ValueError(f"the inter-token latency factor must be above 1, got {factor}")
        self.factor, self.cold_cap, self.min_cap = factor, cold_cap, min_cap
        self.samples: deque[tuple[int, float]] = deque(maxlen=WINDOW)

    def observe(self, num_tokens: int, seconds: float) -> None:
        if num_tokens > 0 and seconds >= 0:
            self.samples.append((num_tokens, seconds))

    def fit(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds per token), or None while the window cannot tell them apart."""
        if len(self.samples) < 2:
            return None
        tokens = [n for n, _ in self.samples]
        if max(tokens) < MIN_SPREAD * min(tokens):
            return None
        n = len(self.samples)
        mean_x = sum(tokens) / n
        mean_y = sum(t for _, t in self.samples) / n
        sxx = sum((x - mean_x) ** 2 for x in tokens)
        sxy = sum((x - mean_x) * (y - mean_y) for x, y in self.samples)
        per_token = sxy / sxx
        if per_token <= 0:
            return None  # noise swamps the size dependence: no basis for a cap
        return max(0.0, mean_y - per_token * mean_x), per_token

    def prefill_cap(self, num_decodes: int) -> int | None:
        """Most prefill tokens for a step with `num_decodes` decodes (None: no decodes, no cap)."""
        if num_decodes == 0:
            return None
        fit = self.fit()
        if fit is None:
            return self.cold_cap
        fixed, per_token = fit
        decode_only_s = fixed + per_token * num_decodes
        return max(self.min_cap, int((self.factor - 1) * decode_only_s / per_token))
