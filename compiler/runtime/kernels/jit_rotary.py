"""Compiled (numba, see runtime/jit.py) rotary position embedding, both forms (ONNX RotaryEmbedding
and ORT's contrib op): each head's first rot_dim features rotated pairwise by the cos/sin rows of
its position, the rest copied, in one call instead of table building, gathers and whole-tensor products.

Pairs are (i, i + rot_dim/2) or, interleaved, (2i, 2i + 1):
    out_1 = x_1 * cos - x_2 * sin,  out_2 = x_2 * cos + x_1 * sin
as attention._rotate computes them (its -sin table times x_2 is the same product). Each output
depends on its own row and position only (batch invariance for decoder plans).

`rotate` returns None where it does not handle the case (compiled kernels off, dtypes that differ,
positions outside the caches: the NumPy path then raises or wraps negatives as NumPy indexing does).
"""

from __future__ import annotations

import numpy as np

from ..jit import jit

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@jit
def _rotate(x, heads_first, cos, sin, positions, interleaved, rot_dim, out):
    """x, out [B, S, N, H], or [B, N, S, H] when heads_first, contiguous (one compiled signature
    per dtype: a layout-dependent signature could round differently); cos, sin [P, >= rot_dim / 2],
    one row per position; positions [1 or B, S] rows of cos/sin. False (nothing written) when a
    position is outside [0, P)."""
    if heads_first:
        batch, heads, seq, size = x.shape
    else:
        batch, seq, heads, size = x.shape
    half = rot_dim // 2
    limit = cos.shape[0]
    shared = positions.shape[0] == 1
    for b in range(positions.shape[0]):
        for s in range(seq):
            if positions[b, s] < 0 or positions[b, s] >= limit:
                return False
    for b in range(batch):
        for s in range(seq):
            p = positions[0 if shared else b, s]
            c, sn = cos[p], sin[p]
            for n in range(heads):
                row = x[b, n, s] if heads_first else x[b, s, n]
                dst = out[b, n, s] if heads_first else out[b, s, n]
                if interleaved:
                    for i in range(half):
                        x1, x2 = row[2 * i], row[2 * i + 1]
                        dst[2 * i] = x1 * c[i] - x2 * sn[i]
                        dst[2 * i + 1] = x2 * c[i] + x1 * sn[i]
                else:
                    for i in range(half):
                        x1, x2 = row[i], row[i + half]
                        dst[i] = x1 * c[i] - x2 * sn[i]
                        dst[i + half] = x2 * c[i] + x1 * sn[i]
                for j in range(rot_dim, size):
                    dst[j] = row[j]
    return True


def rotate(x: np.ndarray, num_heads: int, cos_cache, sin_cache, positions, interleaved: bool,
           rot_dim: int) -> np.ndarray | None:
    """The rotated x ([B, S, N * H], or [B, N, S, H]) as a new contiguous array; `positions`
    [1 or B, S] are rows of the caches, or None when the caches are per token ([1 or B, S,
    >= rot_dim / 2]). None when the compiled path does not take these operands."""
    kernel = _rotate.get()
    dtype = x.dtype
    if kernel is None or dtype not in FLOATS or cos_cache.dtype != dtype or sin_cache.dtype != dtype:
        return None
    heads_first = x.ndim == 4
    if heads_first:
        batch, heads, seq, size = x.shape
    elif x.ndim == 3 and x.shape[2] % num_heads == 0:
        batch, seq, hidden = x.shape
        heads, size = num_heads, hidden // num_heads
    else:
        return None
    if rot_dim % 2 or rot_dim > size or cos_cache.shape != sin_cache.shape or cos_cache.shape[-1] < rot_dim // 2:
        return None
    if positions is None:  # caches [1 or B, S, half]: row b * S + s
        if cos_cache.ndim != 3 or cos_cache.shape[1] != seq or cos_cache.shape[0] not in (1, batch):
            return None
        positions = np.arange(cos_cache.shape[0] * seq, dtype=np.int64).reshape(-1, seq)
        cos_cache, sin_cache = cos_cache.reshape(-1, cos_cache.shape[-1]), sin_cache.reshape(-1, sin_cache.shape[-1])
    elif cos_cache.ndim != 2 or positions.ndim != 2 or positions.shape[1] != seq or positions.shape[0] not in (1, batch):
        return None
    # strided operands are copied, never declined: whether a slice of a fused projection or a cache
    # gathered per run is contiguous can depend on the token count, and the path must not
    x, cos_cache, sin_cache = (a if a.flags.c_contiguous else np.ascontiguousarray(a) for a in (x, cos_cache, sin_cache))
    if positions.dtype != np.int64 or not positions.flags.c_contiguous:
        positions = np.ascontiguousarray(positions, dtype=np.int64)
    x4 = x if heads_first else x.reshape(batch, seq, heads, size)
    out = np.empty(x4.shape, dtype)
    if not kernel(x4, heads_first, cos_cache, sin_cache, positions, interleaved, rot_dim, out):
        return None
    return out if heads_first else out.reshape(x.shape)
