"""Compiled (numba, see runtime/jit.py) GridSample for the common case: 4-D input, bilinear, zeros or
border padding, float32. RAFT's correlation lookups, spatial transformers and deformable attention
sample this way, often thousands of tiny windows a call; the NumPy path (vision.py) builds float64
index arrays for every corner and gathers them with fancy indexing (RAFT-small: 48 calls, 61 ms of a
133 ms run; compiled 17 ms, `infc run --op-profile`). The images of a call are shared between
numba's threads where a thread-safe layer is there (runtime/jit.py): 2x on RAFT's lookups.

Same arithmetic as the NumPy path: coordinates in float64 from the grid's float32 values, border
padding moving an outside coordinate to the clipped one, the four corners weighted (1 - f, f) per
axis, height's weight times width's, summed in float64 in the order (0, 0), (0, 1), (1, 0), (1, 1),
a corner outside the input adding zero (zeros padding), one rounding to float32. A coordinate that
is not finite gives NaN, as the NumPy path's weights do. Reflection padding, other modes and other
ranks keep the NumPy path (`sample_bilinear` returns None).
"""

from __future__ import annotations

import math

import numpy as np

from ..jit import jit, prange

SPREAD_MIN_OUTPUTS = 1 << 14  # sampled values from which the images are shared between threads


@jit
def _bilinear(x, grid, align, border, out):
    batch, channels, height, width = x.shape
    out_h, out_w = grid.shape[1], grid.shape[2]
    half_h1, half_w1 = (height - 1) / 2.0, (width - 1) / 2.0
    low_y, high_y = (0.0, height - 1.0) if align else (-0.5, height - 0.5)
    low_x, high_x = (0.0, width - 1.0) if align else (-0.5, width - 0.5)
    for n in prange(batch):  # the parallel build: images over numba's threads
        for i in range(out_h):
            for j in range(out_w):
                # the grid's last axis lists x (width) first; border padding moves an outside
                # coordinate to the clipped one
                gy, gx = np.float64(grid[n, i, j, 1]), np.float64(grid[n, i, j, 0])
                cy = (gy + 1.0) * half_h1 if align else ((gy + 1.0) * height - 1.0) * 0.5
                cx = (gx + 1.0) * half_w1 if align else ((gx + 1.0) * width - 1.0) * 0.5
                if border and (cy < low_y or cy > high_y):
                    cy = min(max(cy, 0.0), height - 1.0)
                if border and (cx < low_x or cx > high_x):
                    cx = min(max(cx, 0.0), width - 1.0)
                if not (math.isfinite(cy) and math.isfinite(cx)):
                    for c in range(channels):
                        out[n, c, i, j] = np.nan
                    continue
                y0, x0 = math.floor(cy), math.floor(cx)
                fy, fx = cy - y0, cx - x0
                wy0, wy1, wx0, wx1 = 1.0 - fy, fy, 1.0 - fx, fx
                # corner rows and columns inside the input (border padding never leaves it)
                iy0, iy1, ix0, ix1 = int(min(max(y0, 0.0), height - 1.0)), int(min(max(y0 + 1.0, 0.0), height - 1.0)), \
                    int(min(max(x0, 0.0), width - 1.0)), int(min(max(x0 + 1.0, 0.0), width - 1.0))
                in_y0, in_y1 = border or 0.0 <= y0 <= height - 1.0, border or 0.0 <= y0 + 1.0 <= height - 1.0
                in_x0, in_x1 = border or 0.0 <= x0 <= width - 1.0, border or 0.0 <= x0 + 1.0 <= width - 1.0
                w00, w01, w10, w11 = wy0 * wx0, wy0 * wx1, wy1 * wx0, wy1 * wx1
                for c in range(channels):  # indexed in full: a view per pixel costs reference counting
                    v00 = np.float64(x[n, c, iy0, ix0]) if in_y0 and in_x0 else 0.0
                    v01 = np.float64(x[n, c, iy0, ix1]) if in_y0 and in_x1 else 0.0
                    v10 = np.float64(x[n, c, iy1, ix0]) if in_y1 and in_x0 else 0.0
                    v11 = np.float64(x[n, c, iy1, ix1]) if in_y1 and in_x1 else 0.0
                    out[n, c, i, j] = np.float32(((v00 * w00 + v01 * w01) + v10 * w10) + v11 * w11)


def sample_bilinear(x: np.ndarray, grid: np.ndarray, padding: str, align: bool) -> np.ndarray | None:
    """GridSample of x [N, C, H, W] at grid [N, Ho, Wo, 2], bilinear, or None where the NumPy path serves."""
    kernel = _bilinear.get()
    if kernel is None or padding not in ("zeros", "border") or x.ndim != 4 or grid.ndim != 4 or grid.shape[-1] != 2:
        return None
    if x.dtype != np.float32 or grid.dtype != np.float32 or grid.shape[0] != x.shape[0] or 0 in x.shape:
        return None
    out = np.empty((x.shape[0], x.shape[1], grid.shape[1], grid.shape[2]), np.float32)
    spread = _bilinear.get_parallel() if x.shape[0] > 1 and out.size >= SPREAD_MIN_OUTPUTS else None
    (spread or kernel)(np.ascontiguousarray(x), np.ascontiguousarray(grid), bool(align), padding == "border", out)
    return out
