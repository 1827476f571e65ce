"""Attention: ONNX Attention (opset 23+), com.microsoft MultiHeadAttention, and RotaryEmbedding in both
the ONNX (X, cos, sin, position_ids) and the ORT contrib (X, position_ids, cos, sin) forms.

Layout names: B batch, N heads, S query length, T key length, H head size."""

from __future__ import annotations

import numpy as np

from .activation import softmax_last
from .common import arg, is_exotic, np_dtype
from .jit_attention import attend
from .jit_rotary import rotate


def _heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """[B, S, N*H] -> [B, N, S, H] (a view)."""
    b, s, hidden = x.shape
    return x.reshape(b, s, num_heads, hidden // num_heads).transpose(0, 2, 1, 3)


def _merge(y_BNSH: np.ndarray) -> np.ndarray:
    b, n, s, h = y_BNSH.shape
    return y_BNSH.transpose(0, 2, 1, 3).reshape(b, s, n * h)


def softmax_rows(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis (float data; may reuse `scores`); rows that are all -inf give zeros, not NaN."""
    if scores.dtype in (np.float32, np.float64) and scores.size:
        return softmax_last(scores)
    peak = scores.max(axis=-1, keepdims=True)
    masked = np.isneginf(peak)
    if masked.any():
        peak = np.where(masked, 0, peak)
    scores -= peak
    np.exp(scores, out=scores)
    total = scores.sum(axis=-1, keepdims=True)
    if masked.any():
        total[total == 0] = 1
    scores /= total
    return scores


def _bool_to_bias(mask: np.ndarray, dtype) -> np.ndarray:
    return np.where(mask, dtype.type(0), dtype.type(-np.inf)) if mask.dtype == bool else mask.astype(dtype, copy=False)


def _band(q_len, kv_len, offset, left=-1, right=-1, causal=False):
    """Allowed (query i, key j) pairs for causal / sliding windows; offset is scalar or per batch."""
    i = np.arange(q_len).reshape(q_len, 1)
    j = np.arange(kv_len).reshape(1, kv_len)
    position = i + (np.reshape(offset, (-1, 1, 1)) if np.ndim(offset) else int(offset))
    allowed = np.ones(np.broadcast_shapes(position.shape, j.shape), dtype=bool)
    if causal:
        allowed &= j <= position
    if left >= 0:
        allowed &= position - j <= left
    if right >= 0:
        allowed &= j - position <= right
    return allowed[:, None] if allowed.ndim == 3 else allowed


def onnx_attention(inputs, attrs, ctx):
    q, k, v = inputs[:3]
    mask, past_k, past_v, nonpad = arg(inputs, 3), arg(inputs, 4), arg(inputs, 5), arg(inputs, 6)
    dtype = q.dtype
    work = np.dtype(np.float32) if is_exotic(dtype) or dtype == np.float16 else dtype
    q, k, v = (x.astype(work, copy=False) for x in (q, k, v))
    is_3d = q.ndim == 3
    if is_3d:
        q, k, v = _heads(q, attrs["q_num_heads"]), _heads(k, attrs["kv_num_heads"]), _heads(v, attrs["kv_num_heads"])
    scale = attrs.get("scale")
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    if past_k is not None:
        k = np.concatenate([past_k.astype(work, copy=False), k], axis=2)
        v = np.concatenate([past_v.astype(work, copy=False), v], axis=2)
    present_k, present_v = k, v
    s_len, t_len = q.shape[2], k.shape[2]
    bias = np.zeros((s_len, t_len), dtype=work)
    if mask is not None:
        if mask.shape[-1] < t_len:  # a short mask is padded as "masked"
            fill = False if mask.dtype == bool else -np.inf
            mask = np.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, t_len - mask.shape[-1])], constant_values=fill)
        bias = bias + _bool_to_bias(mask, work)
    offset = past_k.shape[2] if past_k is not None else (
        nonpad.reshape(-1) - s_len if nonpad is not None else 0)
    left, right = attrs.get("left_window_size", -1), attrs.get("right_window_size", -1)
    causal = bool(attrs.get("is_causal", 0))
    if causal or left >= 0 or right >= 0:
        bias = bias + np.where(_band(s_len, t_len, offset, left, right, causal), work.type(0), work.type(-np.inf))
    if nonpad is not None:
        keep = np.arange(t_len) < nonpad.reshape(-1, 1)
        bias = bias + np.where(keep, work.type(0), work.type(-np.inf)).reshape(-1, 1, 1, t_len)
    if k.shape[1] != q.shape[1]:  # grouped-query attention: each kv head serves a run of q heads
        k, v = np.repeat(k, q.shape[1] // k.shape[1], axis=1), np.repeat(v, q.shape[1] // k.shape[1], axis=1)
    root = work.type(np.sqrt(scale))
    scores = np.matmul(q * root, np.swapaxes(k, -1, -2) * root)
    softcap = attrs.get("softcap", 0.0) or 0.0
    if softcap > 0:
        scores = np.tanh(scores / softcap) * softcap
    mode = attrs.get("qk_matmul_output_mode", 0)
    qk_out = scores.copy() if mode in (0, 1) else None
    scores = scores + bias
    if mode == 2:
        qk_out = scores.copy()
    precision = attrs.get("softmax_precision")
    if precision is not None:
        scores = scores.astype(np.float32 if is_exotic(np_dtype(precision)) else np_dtype(precision))
    probs = softmax_rows(scores)
    fully_masked = np.isneginf(np.max(bias, axis=-1, keepdims=True))
    if fully_masked.any():
        probs = np.where(fully_masked, 0, probs)
    if mode == 3:
        qk_out = probs
    y = np.matmul(probs.astype(work, copy=False), v)
    if is_3d:
        y = _merge(y)
    return [x.astype(dtype, copy=False) if x is not None else None for x in (y, present_k, present_v, qk_out)]


def mha_operands(inputs, attrs, xp=np):
    """MultiHeadAttention's operands: q [B, N, S, H] and k, v [B, N, T, H] (packed QKV or KV
    unpacked, the optional bias added, past K/V appended), the key padding mask, the attention
    bias and the scale. Array-module generic: the GPU executor shares it (xp = CuPy)."""
    query, key, value, bias = inputs[0], arg(inputs, 1), arg(inputs, 2), arg(inputs, 3)
    padding, attn_bias, past_k, past_v = arg(inputs, 4), arg(inputs, 5), arg(inputs, 6), arg(inputs, 7)
    heads = attrs["num_heads"]
    hidden = query.shape[-1] if query.ndim == 3 else None
    if key is None:  # packed QKV: query is [B, S, N, 3, H]
        q, key, value = (query[:, :, :, i].transpose(0, 2, 1, 3) for i in range(3))
    elif key.ndim == 5:  # packed KV: key is [B, T, N, 2, H]
        q, key, value = _heads(query, heads), key[:, :, :, 0].transpose(0, 2, 1, 3), key[:, :, :, 1].transpose(0, 2, 1, 3)
    else:
        q = _heads(query, heads)
    if bias is not None:
        q = q + _heads(bias[:hidden].reshape(1, 1, -1), heads)
        key = key + bias[hidden:2 * hidden].reshape(1, 1, -1) if key.ndim == 3 else key
        value = value + bias[2 * hidden:].reshape(1, 1, -1) if value.ndim == 3 else value
    k = _heads(key, heads) if key.ndim == 3 else key
    v = _heads(value, heads) if value.ndim == 3 else value
    if past_k is not None:
        k, v = xp.concatenate([past_k, k], axis=2), xp.concatenate([past_v, v], axis=2)
    scale = attrs.get("scale") or 1.0 / float(q.shape[-1]) ** 0.5
    return q, k, v, padding, attn_bias, scale


def multi_head_attention(inputs, attrs, ctx):
    q, k, v, padding, attn_bias, scale = mha_operands(inputs, attrs)
    # softcap: not onnxruntime's attribute; the decoder path's unpacked GroupQueryAttention carries it
    softcap = float(attrs.get("softcap", 0.0) or 0.0)
    # the GEMMs and one compiled call between them when numba is there (jit_attention.py)
    y = None if softcap > 0 else attend(q, k, v, padding, attn_bias, scale, attrs.get("mask_filter_value", -10000.0),
                                        bool(attrs.get("unidirectional", 0)))
    if y is not None:
        return [y, k, v]
    scores = np.matmul(q, np.swapaxes(k, -1, -2))
    scores *= q.dtype.type(scale)
    if softcap > 0:
        scores = np.tanh(scores / softcap) * scores.dtype.type(softcap)
    s_len, t_len = scores.shape[-2:]
    filler = q.dtype.type(attrs.get("mask_filter_value", -10000.0))
    if padding is not None:
        if padding.ndim == 1:  # key lengths per batch
            padding = np.arange(t_len)[None, :] < padding[:, None]
        keep = padding.astype(bool).reshape((padding.shape[0], 1) + (1,) * (3 - padding.ndim) + padding.shape[1:])
        scores = scores + np.where(keep, q.dtype.type(0), filler)  # added, as onnxruntime does (jit_attention.py)
    if attn_bias is not None:
        if attn_bias.ndim <= scores.ndim and all(a == 1 or a == s for a, s in zip(attn_bias.shape[::-1], scores.shape[::-1])):
            scores += attn_bias
        else:
            scores = scores + attn_bias
    if attrs.get("unidirectional", 0):
        scores = np.where(np.tril(np.ones((s_len, t_len), bool), t_len - s_len), scores, q.dtype.type(-np.inf))
    y = np.matmul(softmax_rows(scores), v)
    return [_merge(y), k, v]


def _rotate(x_BSNH: np.ndarray, cos_full: np.ndarray, sin_signed: np.ndarray, interleaved: bool,
            rot_dim: int) -> np.ndarray:
    """x * cos + rotate_pairs(x) * sin over the first rot_dim features of each head, as whole-tensor
    products: cos_full [B or 1, S, rot_dim] holds each cos twice, sin_signed the matching -sin / +sin,
    and the pair swap is a reversed-axis view."""
    b, s, n, h = x_BSNH.shape
    half = rot_dim // 2
    part = x_BSNH if rot_dim == h else x_BSNH[..., :rot_dim]
    if rot_dim == h:
        out = np.multiply(part, cos_full[:, :, None, :])
        rotated = out
    else:
        out = np.empty(x_BSNH.shape, dtype=x_BSNH.dtype)
        rotated = out[..., :rot_dim]
        np.multiply(part, cos_full[:, :, None, :], out=rotated)
        out[..., rot_dim:] = x_BSNH[..., rot_dim:]
    pairs = (2, half) if not interleaved else (half, 2)
    swapped = part.reshape(b, s, n, *pairs)[..., ::-1, :] if not interleaved else part.reshape(b, s, n, *pairs)[..., ::-1]
    product = np.multiply(swapped, sin_signed.reshape(sin_signed.shape[0], s, 1, *pairs))
    rotated += product.reshape(b, s, n, rot_dim)
    return out


_LAST_TABLES: list = [None]  # the last tables built by any step: the rotary steps of one run share their caches


def _rotary_tables(cos_cache, sin_cache, half: int, interleaved: bool, dtype, memo: dict | None):
    """(cos twice, -sin / +sin) tables over the caches' positions, kept while the same caches come back
    (weights: per step; caches computed from the positions each run: shared by that run's steps)."""
    params = (half, interleaved, dtype)
    for cached in (memo.get("tables") if memo is not None else None, _LAST_TABLES[0]):
        if cached is not None and cached[0] is cos_cache and cached[1] is sin_cache and cached[2] == params:
            if memo is not None:
                memo["tables"] = cached
            return cached[3]
    cos, sin = cos_cache[..., :half].astype(dtype, copy=False), sin_cache[..., :half].astype(dtype, copy=False)
    if interleaved:
        tables = (np.repeat(cos, 2, axis=-1), np.stack([-sin, sin], axis=-1).reshape(*sin.shape[:-1], 2 * half))
    else:
        tables = (np.concatenate([cos, cos], axis=-1), np.concatenate([-sin, sin], axis=-1))
    entry = (cos_cache, sin_cache, params, tables)
    _LAST_TABLES[0] = entry
    if memo is not None:
        memo["tables"] = entry
    return tables


def _rotary(x, cos_cache, sin_cache, positions, attrs, memo=None):
    dtype = x.dtype
    work = x.astype(np.float32) if is_exotic(dtype) else x
    if work.ndim == 4:  # [B, N, S, H]
        x_BSNH = work.transpose(0, 2, 1, 3)
    else:
        b, s, hidden = work.shape
        heads = attrs.get("num_heads") or hidden // (2 * cos_cache.shape[-1])
        x_BSNH = work.reshape(b, s, heads, hidden // heads)
    rot_dim = attrs.get("rotary_embedding_dim", 0) or x_BSNH.shape[-1]
    interleaved = bool(attrs.get("interleaved", 0))
    if work is x:  # one compiled call when numba is there (jit_rotary.py)
        compiled = rotate(x, x_BSNH.shape[2], cos_cache, sin_cache, positions, interleaved, rot_dim)
        if compiled is not None:
            return [compiled]
    cos_full, sin_signed = _rotary_tables(cos_cache, sin_cache, rot_dim // 2, interleaved, work.dtype, memo)
    if positions is not None:
        cos_full, sin_signed = cos_full[positions], sin_signed[positions]
    y = _rotate(x_BSNH, cos_full, sin_signed, interleaved, rot_dim)
    if work.ndim == 4:
        y = np.ascontiguousarray(y.transpose(0, 2, 1, 3))
    else:
        y = y.reshape(work.shape)
    return [y.astype(dtype, copy=False)]


def onnx_rotary(inputs, attrs, ctx):
    return _rotary(inputs[0], inputs[1], inputs[2], arg(inputs, 3), attrs, ctx.memo if ctx is not None else None)


def contrib_rotary(inputs, attrs, ctx):
    x, positions = inputs[0], inputs[1]
    seq = x.shape[2] if x.ndim == 4 else x.shape[1]
    if positions.size == 1:  # a scalar start offset
        positions = int(positions.reshape(-1)[0]) + np.arange(seq)[None, :]
    return _rotary(x, inputs[2], inputs[3], positions.astype(np.int64, copy=False), attrs,
                   ctx.memo if ctx is not None else None)


KERNELS = {
    ("", "Attention"): onnx_attention,
    ("", "RotaryEmbedding"): onnx_rotary,
    ("com.microsoft", "MultiHeadAttention"): multi_head_attention,
    ("com.microsoft", "RotaryEmbedding"): contrib_rotary,
}
