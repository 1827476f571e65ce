"""Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (weights, ignore_index, reductions)."""

from __future__ import annotations

import numpy as np

from .common import arg


def nll(log_prob: np.ndarray, target: np.ndarray, weight, reduction: str, ignore_index) -> np.ndarray:
    """log_prob: (N, C, d...), target: (N, d...)."""
    target = target.astype(np.int64)
    ignored = target == ignore_index if ignore_index is not None else np.zeros(target.shape, bool)
    safe = np.where(ignored, 0, target)
    picked = np.take_along_axis(log_prob, safe[:, None], axis=1)[:, 0]
    w = weight[safe] if weight is not None else np.ones_like(picked)
    w = np.where(ignored, 0, w).astype(log_prob.dtype)
    loss = -picked * w
    if reduction == "none":
        return loss.astype(log_prob.dtype)
    if reduction == "sum":
        return np.array(loss.sum(), dtype=log_prob.dtype)
    total = w.sum()
    return np.array(loss.sum() / total if total else 0.0, dtype=log_prob.dtype)


def nll_loss(inputs, attrs, ctx):
    return [nll(inputs[0], inputs[1], arg(inputs, 2), attrs.get("reduction", "mean"), attrs.get("ignore_index"))]


def softmax_cross_entropy(inputs, attrs, ctx):
    scores, labels, weight = inputs[0], inputs[1], arg(inputs, 2)
    shifted = scores - scores.max(axis=1, keepdims=True)
    log_prob = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = nll(log_prob, labels, weight, attrs.get("reduction", "mean"), attrs.get("ignore_index"))
    return [loss, log_prob.astype(scores.dtype, copy=False)]


KERNELS = {
    ("", "NegativeLogLikelihoodLoss"): nll_loss,
    ("", "SoftmaxCrossEntropyLoss"): softmax_cross_entropy,
}
