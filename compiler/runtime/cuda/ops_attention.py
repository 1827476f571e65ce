"""Device attention ops over an array module: com.microsoft MultiHeadAttention and RotaryEmbedding (the
ONNX and the ORT contrib forms), with the semantics of the CPU kernels in runtime/kernels/attention.py.
Layout names: B batch, N heads, S query length, T key length, H head size.

MultiHeadAttention is two batched GEMMs (cuBLAS through xp.matmul) around a masked softmax over T;
the mask and the causal band are built on the device. With the plan's row kernels (rows.py) the scale,
the causal band and the softmax are one in-place pass over the scores. Rotary tables (cos twice, -sin / +sin) are
gathered per run from the caches by position, as the CPU kernel does."""

from __future__ import annotations

import numpy as np

from ..kernels.attention import mha_operands
from ..kernels.common import arg


def _merge(y_BNSH, xp):
    b, n, s, h = y_BNSH.shape
    return xp.ascontiguousarray(y_BNSH.transpose(0, 2, 1, 3)).reshape(b, s, n * h)


def softmax_last(scores, xp):
    """Softmax over T; rows that are all -inf give zeros, not NaN (as the CPU kernel)."""
    peak = scores.max(axis=-1, keepdims=True)
    peak = xp.where(xp.isneginf(peak), scores.dtype.type(0), peak)
    e = xp.exp(scores - peak)
    total = e.sum(axis=-1, keepdims=True)
    return e / xp.where(total == 0, total.dtype.type(1), total)


def _masked(scores, padding, attn_bias, filler, xp):
    """Scores with `filler` added on padded keys, then the additive bias, as onnxruntime applies them (a row
    whose keys are all padded keeps its scores' differences, as the CPU kernel)."""
    if padding is not None:
        if padding.ndim == 1:  # key lengths per batch
            padding = xp.arange(scores.shape[-1])[None, :] < padding[:, None]
        keep = padding.astype(bool).reshape((padding.shape[0], 1) + (1,) * (3 - padding.ndim) + padding.shape[1:])
        scores = scores + xp.where(keep, scores.dtype.type(0), scores.dtype.type(filler))  # added, as onnxruntime does
    if attn_bias is not None:
        scores = scores + attn_bias
    return scores


def multi_head_attention(inputs, attrs, ctx):
    xp = ctx.xp
    q, k, v, padding, attn_bias, scale = mha_operands(inputs, attrs, xp)
    scores = xp.matmul(q, xp.swapaxes(k, -1, -2))
    rows = ctx.rows
    if rows is not None and rows.may_softmax(scores):  # scale, causal band and softmax: one pass, in place
        filler = attrs.get("mask_filter_value", -10000.0)
        if padding is not None or attn_bias is not None:  # those go first, as array ops
            scores = _masked(scores * scores.dtype.type(scale), padding, attn_bias, filler, xp)
            scale = 1.0
        causal_len = scores.shape[-2] if attrs.get("unidirectional", 0) else 0  # future keys dropped: -inf
        probs = rows.softmax(scores, xp, scale=scale, causal_len=causal_len, filler=float("-inf"), in_place=True)
        return [_merge(xp.matmul(probs, v), xp), k, v]
    scores = scores * q.dtype.type(scale)
    s_len, t_len = scores.shape[-2:]
    filler = q.dtype.type(attrs.get("mask_filter_value", -10000.0))
    scores = _masked(scores, padding, attn_bias, filler, xp)
    if attrs.get("unidirectional", 0):
        scores = xp.where(xp.tril(xp.ones((s_len, t_len), dtype=bool), t_len - s_len), scores, q.dtype.type(-np.inf))
    y = xp.matmul(softmax_last(scores, xp), v)
    return [_merge(y, xp), k, v]


def _tables(cos_cache, sin_cache, half: int, interleaved: bool, dtype, xp):
    cos, sin = cos_cache[..., :half].astype(dtype, copy=False), sin_cache[..., :half].astype(dtype, copy=False)
    if interleaved:
        return xp.repeat(cos, 2, axis=-1), xp.stack([-sin, sin], axis=-1).reshape(*sin.shape[:-1], 2 * half)
    return xp.concatenate([cos, cos], axis=-1), xp.concatenate([-sin, sin], axis=-1)


def _rotary(x, cos_cache, sin_cache, positions, attrs, xp):
    """x * cos + (pairs of x swapped) * (-sin, +sin) over the first rot_dim features of each head."""
    if x.ndim == 4:  # [B, N, S, H]
        x_BSNH = x.transpose(0, 2, 1, 3)
    else:
        b, s, hidden = x.shape
        heads = attrs.get("num_heads") or hidden // (2 * cos_cache.shape[-1])
        x_BSNH = x.reshape(b, s, heads, hidden // heads)
    b, s, n, h = x_BSNH.shape
    rot_dim = attrs.get("rotary_embedding_dim", 0) or h
    half, interleaved = rot_dim // 2, bool(attrs.get("interleaved", 0))
    cos_full, sin_signed = _tables(cos_cache, sin_cache, half, interleaved, x.dtype, xp)
    if positions is not None:
        cos_full, sin_signed = cos_full[positions], sin_signed[positions]
    part = x_BSNH[..., :rot_dim]
    pairs = (half, 2) if interleaved else (2, half)
    swapped = part.reshape(b, s, n, *pairs)[..., ::-1] if interleaved else part.reshape(b, s, n, *pairs)[..., ::-1, :]
    rotated = part * cos_full[:, :, None, :] + (swapped * sin_signed.reshape(sin_signed.shape[0], s, 1, *pairs)).reshape(b, s, n, rot_dim)
    y = rotated if rot_dim == h else xp.concatenate([rotated, x_BSNH[..., rot_dim:]], axis=-1)
    y = xp.ascontiguousarray(y.transpose(0, 2, 1, 3)) if x.ndim == 4 else y.reshape(x.shape)
    return [y.astype(x.dtype, copy=False)]


def onnx_rotary(inputs, attrs, ctx):
    return _rotary(inputs[0], inputs[1], inputs[2], arg(inputs, 3), attrs, ctx.xp)


def contrib_rotary(inputs, attrs, ctx):
    x, positions = inputs[0], inputs[1]
    seq = x.shape[2] if x.ndim == 4 else x.shape[1]
    if positions.size == 1:  # a scalar start offset
        positions = positions.reshape(-1)[:1] + ctx.xp.arange(seq)[None, :]
    return _rotary(x, inputs[2], inputs[3], positions.astype("int64", copy=False), attrs, ctx.xp)


ATTENTION = {
    ("com.microsoft", "MultiHeadAttention"): multi_head_attention,
    ("", "RotaryEmbedding"): onnx_rotary,
    ("com.microsoft", "RotaryEmbedding"): contrib_rotary,
}
