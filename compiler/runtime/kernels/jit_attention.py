"""Compiled (numba, see runtime/jit.py) middle of MultiHeadAttention: between the two products
(which stay BLAS GEMMs: on heads of 16 their loops are too short for LLVM to vectorize, and
NumPy's batched matmul runs them 2-4x faster than compiled loops did), the scale, key padding mask,
attention bias, causal mask and softmax run as one call over the scores instead of ~12 NumPy passes.

Same order of operations as attention.multi_head_attention: scores * scale, + the filler value on
masked keys, + bias, causal positions -inf, softmax (rows that are all -inf give zeros, a NaN makes its
row NaN). Each row's result depends on that row alone. The filler is added and future keys dropped as
onnxruntime's CPU MultiHeadAttention does: a query whose visible keys are all masked (left padding
under a causal mask, an all-zero mask row) then attends over its visible keys by their scores, where
setting them to the filler made it attend uniformly over every key, future ones included.

`attend` returns None where it does not handle the case and the caller takes its NumPy path.
"""

# ruff: noqa: PLR1730, FURB136 - min()/max() would not keep a NaN (the compares do)

from __future__ import annotations

import math

import numpy as np

from ..gemm_impls import HELPERS, PARALLEL_MIN_BYTES, parallel_for
from ..jit import jit

# stand-ins for an absent bias or mask: no keys (the kernel reads only their length)
_NO_BIAS = np.empty((1, 1, 1, 0), np.float32)
_NO_MASK = np.empty((1, 1, 0), np.bool_)

# exp for the softmax, vectorizable (a libm call per element is not): Cephes' expf, exp(r) * 2^n
# with n = round(x / ln 2), the power of two built from its bits; 1 ulp on the softmax's range
_LOG2E, _LN2_HI, _LN2_LO = 1.44269504088896341, 0.693359375, -2.12194440e-4
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
_EXP_LOW = -87.0  # below, exp is under float32's normal range: 0 (the softmax's masked keys)
# activation.softmax_last's fast path: exp(min(x, 80)) never overflows, even summed over 6000 keys;
# a row sum outside [1e-20, 5e34) shows a clamped or an underflowing row
_EXP_CLAMP, _FAST_LOW, _FAST_HIGH = 80.0, 1e-20, 5e34


@jit
def _softmax_scores(scores, bias, keep, scale, filler, causal, probs):
    """probs [B, N, S, T] = the attention probabilities of scores [B, N, S, T] (float32, contiguous;
    the masked and biased scores are left in it). bias [1 or B, 1 or N, 1 or S, T] or empty; keep
    [1 or B, 1 or S, T] (False: the key is masked) or empty.

    Rows are short (16 keys here), too short for LLVM's vector loops, so the exp runs once over all
    rows without subtracting each row's peak, clamped at 80 so nothing overflows (as
    activation.softmax_last's fast path); a row whose sum shows a clamped or underflowing value, a
    NaN or only -inf is redone the classic way (peak subtracted; all -inf gives zeros)."""
    f32 = np.float32
    batch, heads, seq, keys = scores.shape
    has_bias, has_keep = bias.shape[3] > 0, keep.shape[2] > 0
    zero, half, one = f32(0), f32(0.5), f32(1)
    low, log2e, ln2_hi, ln2_lo = f32(_EXP_LOW), f32(_LOG2E), f32(_LN2_HI), f32(_LN2_LO)
    e0, e1, e2 = f32(_EXP_POLY[0]), f32(_EXP_POLY[1]), f32(_EXP_POLY[2])
    e3, e4, e5 = f32(_EXP_POLY[3]), f32(_EXP_POLY[4]), f32(_EXP_POLY[5])
    clamp, sum_low, sum_high = f32(_EXP_CLAMP), f32(_FAST_LOW), f32(_FAST_HIGH)
    minus_inf = f32(-math.inf)
    for b in range(batch):
        for n in range(heads):
            for s in range(seq):
                row = scores[b, n, s]
                kept = keep[b if keep.shape[0] > 1 else 0, s if keep.shape[1] > 1 else 0]
                shift = bias[b if bias.shape[0] > 1 else 0, n if bias.shape[1] > 1 else 0, s if bias.shape[2] > 1 else 0]
                visible = s + keys - seq if causal else keys  # query s sees keys up to s + T - S
                for j in range(keys):
                    x = row[j] * scale
                    if has_keep and not kept[j]:
                        x += filler
                    if has_bias:
                        x += shift[j]
                    if j > visible:
                        x = minus_inf
                    row[j] = x
    flat, out = scores.reshape(-1), probs.reshape(-1)
    count = flat.shape[0]
    bits = np.empty(count, np.int32)
    powers = bits.view(np.float32)
    for i in range(count):  # exp(min(x, 80)), vectorized over all rows
        x = flat[i]
        if x > clamp:
            x = clamp
        clamped = x if x >= low else low  # NaN -> low: the bits stay valid, r keeps the NaN
        y = clamped * log2e + half
        whole = np.int32(y)  # floor without a libm call: truncate, then step down below zero
        if whole > y:
            whole -= np.int32(1)
        m = f32(whole)
        bits[i] = (whole + np.int32(127)) << np.int32(23)
        r = x - m * ln2_hi - m * ln2_lo
        e = (((((e0 * r + e1) * r + e2) * r + e3) * r + e4) * r + e5) * (r * r) + r + one
        out[i] = zero if x < low else e
    for i in range(count):
        out[i] *= powers[i]
    rows, results = scores.reshape(-1, keys), probs.reshape(-1, keys)
    for index in range(rows.shape[0]):
        result = results[index]
        total = result[0]
        for j in range(1, keys):
            total += result[j]
        if not (total >= sum_low and total < sum_high):  # the classic way (NaN lands here too)
            row = rows[index]
            peak = row[0]
            for j in range(1, keys):
                if row[j] > peak or row[j] != row[j]:  # NaN wins: the row is NaN, as in NumPy
                    peak = row[j]
            if peak == minus_inf:  # every key masked with -inf: zeros
                for j in range(keys):
                    result[j] = zero
                continue
            total = zero
            for j in range(keys):
                result[j] = math.exp(row[j] - peak)
                total += result[j]
        inverse = one / total
        for j in range(keys):
            result[j] *= inverse


def _keep_mask(padding, batch: int, seq: int, keys: int) -> np.ndarray | None:
    """The key padding mask as bool [1 or B, 1 or S, T], as the NumPy path reads it: [B] key
    lengths, [B, T] or [B, S, T] (nonzero: keep)."""
    if padding is None:
        return _NO_MASK
    if padding.ndim == 1 and padding.shape[0] == batch:
        return (np.arange(keys)[None, :] < padding[:, None]).reshape(batch, 1, keys)
    if padding.ndim == 2 and padding.shape == (batch, keys):
        return padding.astype(bool).reshape(batch, 1, keys)
    if padding.ndim == 3 and padding.shape == (batch, seq, keys):
        return np.ascontiguousarray(padding.astype(bool))
    return None


def _bias_4d(attn_bias, dtype, shape: tuple) -> np.ndarray | None:
    """The attention bias as a contiguous 4-D array whose dims are 1 or those of the scores."""
    if attn_bias is None:
        return _NO_BIAS
    if attn_bias.dtype != dtype or attn_bias.ndim > 4 or attn_bias.shape[-1] != shape[-1]:
        return None
    bias = attn_bias.reshape((1,) * (4 - attn_bias.ndim) + attn_bias.shape)
    if any(a != 1 and a != s for a, s in zip(bias.shape, shape)):
        return None
    return bias if bias.flags.c_contiguous else np.ascontiguousarray(bias)


def attend(q, k, v, padding, attn_bias, scale: float, filler: float, causal: bool) -> np.ndarray | None:
    """y [B, S, N * H] from q [B, N, S, H] and k, v [B, N, T, H] (float32), or None. Large problems
    are split between the cores: by batch items when there are several, else by heads (each part is
    the same two GEMMs and compiled call over its slice; rows never depend on the split)."""
    kernel = _softmax_scores.get()
    dtype = q.dtype
    if kernel is None or dtype != np.float32 or k.dtype != dtype or v.dtype != dtype:
        return None
    batch, heads, seq, size = q.shape
    keys = k.shape[2]
    if keys == 0 or k.shape != (batch, heads, keys, size) or v.shape[:3] != k.shape[:3]:
        return None
    keep = _keep_mask(padding, batch, seq, keys)
    bias = _bias_4d(attn_bias, dtype, (batch, heads, seq, keys))
    if keep is None or bias is None:
        return None
    width = v.shape[-1]
    y = np.empty((batch, seq, heads * width), dtype)
    y_BNSH = y.reshape(batch, seq, heads, width).transpose(0, 2, 1, 3)
    by_batch = batch > 1
    count = batch if by_batch else heads
    nbytes = 4 * batch * heads * seq * keys  # the scores
    parts = min(count, 2 * HELPERS + 2) if HELPERS and nbytes >= PARALLEL_MIN_BYTES else 1
    bounds = [count * i // parts for i in range(parts + 1)]

    def part(index: int) -> None:
        lo, hi = bounds[index], bounds[index + 1]
        if by_batch:
            where = (slice(lo, hi),)
            part_keep = keep[lo:hi] if keep.shape[0] > 1 else keep
            part_bias = bias[lo:hi] if bias.shape[0] > 1 else bias
        else:
            where = (slice(None), slice(lo, hi))
            part_keep = keep
            part_bias = bias[:, lo:hi] if bias.shape[1] > 1 else bias
        scores = np.matmul(q[where], np.swapaxes(k[where], -1, -2))
        probs = np.empty(scores.shape, dtype)
        kernel(scores, part_bias if part_bias.flags.c_contiguous else np.ascontiguousarray(part_bias), part_keep,
               dtype.type(scale), dtype.type(filler), causal, probs)
        np.matmul(probs, v[where], out=y_BNSH[where])

    parallel_for(parts, part, nbytes)
    return y


def softmax_last(x: np.ndarray) -> np.ndarray | None:
    """Softmax over the last axis of float32 data as a new array (a standalone Softmax: the scores'
    pass without scale, mask or bias), or None where the compiled path does not apply. One call
    instead of activation.softmax_last's eight NumPy passes, which cost more than the work on the
    small rows of eager-attention exports."""
    kernel = _softmax_scores.get()
    if kernel is None or x.dtype != np.float32 or x.ndim == 0 or x.size == 0:
        return None
    keys = x.shape[-1]
    scores = np.array(x, dtype=np.float32, order="C").reshape(1, 1, -1, keys)  # the kernel writes into it
    probs = np.empty(scores.shape, np.float32)
    kernel(scores, _NO_BIAS, _NO_MASK, np.float32(1.0), np.float32(-math.inf), False, probs)
    return probs.reshape(x.shape)
