"""The chain kernel (chain_gemm.py) reading its weight as 8-bit codes: decode-sized GEMMs of weight-only
quantized decoder plans (`--precision w8`, onnxruntime-genai int4 exports).

    W[k, n] = (codes[k, n] - zero[k // G, n]) * scale[k // G, n]       codes, zero: int8 or uint8

Why: one decode row streams the whole weight for two FLOPs per element, so its time is the weight's
bytes. Such plans hold W as codes plus per-group scales (a quarter of the float32 bytes, and small
enough to stay in the last-level cache). The executor still dequantizes W once for the rows the
BLAS serves; this kernel serves the few rows of decode steps from the codes.

Each element is rebuilt exactly as the plan's DequantizeLinear step builds it (integer minus zero
point, exact in float32, times the scale: one rounding), and the sums run in the chain kernel's
order, so the result equals the chain kernel's on the dequantized W bit for bit, and with it the
BLAS recipe's where invariant_gemm matched one: batch invariance holds across the two paths.

Four k rows at a time are rebuilt into a scratch tile in L1, then summed by chain_gemm.py's loop;
one row with four k rows in one scale group (the common case: groups of 16 or 32, blocks cut at
multiples of them) rebuilds and sums in one pass. That loop is written out here again: numba
kernels share code only through calls, and a shared loop, even inlined, measured 5-20% slower in
the chain kernel.
"""

from __future__ import annotations

import numpy as np

from .chain_gemm import over_column_blocks
from .jit import IN_ORDER, jit, prange

TILE = 1024  # columns per tile, as chain_gemm.TILE: accumulators and four rebuilt rows stay in L1


@jit(fastmath=IN_ORDER)
def _chain_codes(a, codes, scale, zero, group, bounds, n0, n1, out):
    """out[:, n0:n1] = a @ W[:, n0:n1] with W as above, K cut at `bounds` (chain_gemm._chain_columns)."""
    rows = a.shape[0]
    acc = np.empty((rows, TILE), np.float32)
    rebuilt = np.empty((4, TILE), np.float32)
    for t0 in range(n0, n1, TILE):
        width = min(TILE, n1 - t0)
        t1 = t0 + width
        for m in range(rows):
            for j in range(width):
                out[m, t0 + j] = 0.0
        for b in range(len(bounds) - 1):
            for m in range(rows):
                for j in range(width):
                    acc[m, j] = 0.0
            k, end = bounds[b], bounds[b + 1]
            while k + 4 <= end:
                g = k // group
                if rows == 1 and g == (k + 3) // group:  # one row, one scale group: rebuild and sum in one pass
                    s, z = scale[g, t0:t1], zero[g, t0:t1]
                    c0, c1, c2, c3 = codes[k, t0:t1], codes[k + 1, t0:t1], codes[k + 2, t0:t1], codes[k + 3, t0:t1]
                    x0, x1, x2, x3 = a[0, k], a[0, k + 1], a[0, k + 2], a[0, k + 3]
                    r0 = acc[0]
                    for j in range(width):
                        sj, zj = s[j], np.float32(z[j])
                        v0 = (np.float32(c0[j]) - zj) * sj
                        v1 = (np.float32(c1[j]) - zj) * sj
                        v2 = (np.float32(c2[j]) - zj) * sj
                        v3 = (np.float32(c3[j]) - zj) * sj
                        r0[j] = (((r0[j] + x0 * v0) + x1 * v1) + x2 * v2) + x3 * v3
                    k += 4
                    continue
                for i in range(4):
                    gi = (k + i) // group
                    s, z, c, row = scale[gi, t0:t1], zero[gi, t0:t1], codes[k + i, t0:t1], rebuilt[i]
                    for j in range(width):
                        row[j] = (np.float32(c[j]) - np.float32(z[j])) * s[j]
                w0, w1, w2, w3 = rebuilt[0], rebuilt[1], rebuilt[2], rebuilt[3]
                m = 0
                while m + 2 <= rows:  # as chain_gemm._chain_columns (kept inline: see the module docstring)
                    x0, x1, x2, x3 = a[m, k], a[m, k + 1], a[m, k + 2], a[m, k + 3]
                    y0, y1, y2, y3 = a[m + 1, k], a[m + 1, k + 1], a[m + 1, k + 2], a[m + 1, k + 3]
                    r0, r1 = acc[m], acc[m + 1]
                    for j in range(width):
                        v0, v1, v2, v3 = w0[j], w1[j], w2[j], w3[j]
                        r0[j] = (((r0[j] + x0 * v0) + x1 * v1) + x2 * v2) + x3 * v3
                        r1[j] = (((r1[j] + y0 * v0) + y1 * v1) + y2 * v2) + y3 * v3
                    m += 2
                if m < rows:
                    x0, x1, x2, x3 = a[m, k], a[m, k + 1], a[m, k + 2], a[m, k + 3]
                    r0 = acc[m]
                    for j in range(width):
                        v0, v1, v2, v3 = w0[j], w1[j], w2[j], w3[j]
                        r0[j] = (((r0[j] + x0 * v0) + x1 * v1) + x2 * v2) + x3 * v3
                k += 4
            while k < end:
                g = k // group
                s, z, c, w0 = scale[g, t0:t1], zero[g, t0:t1], codes[k, t0:t1], rebuilt[0]
                for j in range(width):
                    w0[j] = (np.float32(c[j]) - np.float32(z[j])) * s[j]
                for m in range(rows):
                    x0 = a[m, k]
                    row = acc[m]
                    for j in range(width):
                        row[j] = row[j] + x0 * w0[j]
                k += 1
            for m in range(rows):
                for j in range(width):
                    out[m, t0 + j] += acc[m, j]


@jit(fastmath=IN_ORDER, calls=(_chain_codes,))
def _codes_blocks(a, codes, scale, zero, group, bounds, blocks, out):
    """_chain_codes on each column block (the parallel build: one per thread)."""
    for i in prange(blocks.shape[0]):
        _chain_codes(a, codes, scale, zero, group, bounds, blocks[i, 0], blocks[i, 1], out)


def codes_product(a: np.ndarray, codes: np.ndarray, scale: np.ndarray, zero: np.ndarray, group: int,
                  edges: np.ndarray, blocks) -> np.ndarray | None:
    """a [M, K] @ W [K, N] given as codes [K, N], scale and zero [ceil(K / group), N]; K cut at
    `edges`, columns in `blocks` (shared with the helper thread). None when compiled kernels are off."""
    kernel = _chain_codes.get()
    if kernel is None:
        return None
    a = np.ascontiguousarray(a)
    out = np.empty((a.shape[0], codes.shape[1]), np.float32)
    over_column_blocks(blocks, codes.shape[1], lambda n0, n1: kernel(a, codes, scale, zero, group, edges, n0, n1, out),
                       _codes_blocks, lambda spread, array: spread(a, codes, scale, zero, group, edges, array, out))
    return out
