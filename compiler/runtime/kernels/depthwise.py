"""Depthwise 2-D convolutions (one input channel per group, any channel multiplier, stride,
dilation and pads) as batched BLAS GEMMs over banded weight matrices, with a kw-fold copy of the
input instead of im2col's kh*kw-fold one.

For a tile of `rows` output rows of one channel, every output row is a banded combination of
`span` consecutive input rows, each shifted by the kw column taps. With the input laid out as
shifted rows S[c, r, j, n, ow] = x[n, c, r - pad_top, ow*sw + j*dw - pad_left] (zero outside the
image), a tile is one GEMM:

    y[c, tile] (rows x N*OW) = band[c] (rows x span*kw) @ S[c, tile rows] (span*kw x N*OW)

band[c][o, (r, j)] = w[c, i, j] where r = o*sh + i*dh. Tiles of a channel read overlapping row
ranges of S through one strided view, so NumPy's matmul runs them all, for a block of channels,
in one call (one sgemm per tile); the band matrix does (span / kh) times the useful multiplies,
which BLAS pays for easily against the copies and the per-call costs it saves. Channels go in
blocks whose S and output stay in cache.

This is the NumPy path: with compiled kernels on, jit_conv.direct computes depthwise convolutions
directly (one pass per output row, no band waste). Caveat of the band form: its zero band entries
multiply every input row of a tile, so a NaN or Inf input spreads NaN to outputs of its tile whose
windows do not read it.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

BLOCK_BYTES = 1 << 20  # S and output of a channel block, kept in L2 between the copy and the GEMM
ROWS_PER_TILE = {1: 8, 2: 8, 3: 8}  # kernel height -> output rows per GEMM (else 4): band waste vs calls


def is_depthwise(x_shape, w_shape, group: int) -> bool:
    return len(x_shape) == 4 and group > 1 and group == x_shape[1] and w_shape[1] == 1 and w_shape[0] % group == 0


class DepthwisePlan:
    """What depends on the shapes only: tiling, the copies that build S, the channel blocks."""

    def __init__(self, x_shape, w_shape, geo, dtype):
        n, c, h, w = x_shape
        m, _, kh, kw = w_shape
        (sh, sw), (dh, dw), (pt, pl), (oh, ow) = geo.strides, geo.dilations, geo.pads_begin, geo.out
        self.n, self.c, self.m, self.mult = n, c, m, m // c
        self.kh, self.kw, self.sh, self.dh = kh, kw, sh, dh
        self.oh, self.ow = oh, ow
        target = min(oh, ROWS_PER_TILE.get(kh, 4))
        self.num_tiles = -(-oh // max(target, 1))
        self.rows = -(-oh // self.num_tiles)  # output rows per tile
        self.span = (self.rows - 1) * sh + (kh - 1) * dh + 1  # input rows a tile reads
        self.depth = self.span * kw  # the GEMMs' K
        self.s_rows = (self.num_tiles * self.rows - 1) * sh + (kh - 1) * dh + 1
        self.width = n * ow  # the GEMMs' N: every image side by side
        self.dtype = np.dtype(dtype)
        # x viewed as (C, H, N, W): one strided copy per column tap fills S's interior
        copied_rows = max(0, min(h, self.s_rows - pt))
        self.copies = []
        for j in range(kw):
            first = max(0, -(-(pl - j * dw) // sw))
            last = min(ow, (w - 1 + pl - j * dw) // sw + 1)
            if last > first and copied_rows:
                start = first * sw + j * dw - pl
                self.copies.append(((slice(pt, pt + copied_rows), j, slice(None), slice(first, last)),
                                    (slice(0, copied_rows), slice(None), slice(start, start + (last - first - 1) * sw + 1, sw))))
        per_channel = (self.s_rows * kw + self.mult * self.num_tiles * self.rows) * self.width * self.dtype.itemsize
        block = max(1, min(c, BLOCK_BYTES // max(per_channel, 1)))
        self.blocks = [(start, min(start + block, c)) for start in range(0, c, block)]
        self.block = block
        self.is_direct = n == 1 and self.num_tiles * self.rows == oh  # GEMM output is y itself
        self._views = None  # see _block_views

    def band(self, w: np.ndarray) -> np.ndarray:
        """(C, mult, 1, rows, span*kw): the band matrices of every output channel."""
        taps = w.reshape(self.c, self.mult, self.kh, self.kw)
        band = np.zeros((self.c, self.mult, self.rows, self.span, self.kw), dtype=w.dtype)
        for o in range(self.rows):
            for i in range(self.kh):
                band[:, :, o, o * self.sh + i * self.dh, :] = taps[:, :, i, :]
        return band.reshape(self.c, self.mult, 1, self.rows, self.depth)

    def _block_views(self) -> list:
        """Per channel block: the S regions the copies fill, the tiles' GEMM view of S, and (unless
        the GEMM writes y directly) the output block; S is zero outside the copied interior, which
        every block rewrites alike, so the buffers and views are built once."""
        if self._views is None:
            s = np.zeros((self.block, self.s_rows, self.kw, self.n, self.ow), self.dtype)
            out = None if self.is_direct else np.empty(
                (self.block, self.mult, self.num_tiles, self.rows, self.width), self.dtype)
            item = self.dtype.itemsize
            tile_stride = self.rows * self.sh * self.kw * self.width * item
            self._views = []
            for first, last in self.blocks:
                count = last - first
                part = s[:count]
                copies = [(part[(slice(None),) + target], (slice(first, last),) + window) for target, window in self.copies]
                tiles = as_strided(part, (count, 1, self.num_tiles, self.depth, self.width),
                                   (s.strides[0], 0, tile_stride, self.width * item, item))
                self._views.append((copies, tiles, None if out is None else out[:count]))
        return self._views

    def run(self, x: np.ndarray, band: np.ndarray, bias, epilogue=None) -> np.ndarray:
        y = np.empty((self.n, self.m, self.oh, self.ow), self.dtype)
        xt = x.transpose(1, 2, 0, 3)
        bias_col = None if bias is None else bias.reshape(self.c, self.mult, 1, 1, 1).astype(self.dtype, copy=False)
        direct = y.reshape(self.c, self.mult, self.num_tiles, self.rows, self.width) if self.is_direct else None
        # blocks run on this thread: sharing them with the helper thread measured slower (short calls)
        for (first, last), (copies, tiles, out) in zip(self.blocks, self._block_views()):
            for target, window in copies:
                np.copyto(target, xt[window])
            block = direct[first:last] if direct is not None else out
            np.matmul(band[first:last], tiles, out=block)
            if bias_col is not None:
                block += bias_col[first:last]
            if epilogue is not None:
                epilogue(block)
            if direct is None:  # (c, mult, rows, n, ow) -> y[n, c*mult + k, rows, ow]
                rows = block.reshape((last - first) * self.mult, self.num_tiles * self.rows, self.n, self.ow)[:, :self.oh]
                np.copyto(y[:, first * self.mult:last * self.mult], rows.transpose(2, 0, 1, 3))
        return y


def depthwise_conv(x, w, bias, geo, memo: dict, epilogue=None) -> np.ndarray:
    """The plan and band matrices live in the step's memo (rebuilt when the shapes or the weight
    array change)."""
    key = ("depthwise", x.shape, x.dtype, w.shape, geo)
    plan = memo.get(key)
    if plan is None:
        if len(memo) > 32:
            memo.clear()
        plan = memo[key] = DepthwisePlan(x.shape, w.shape, geo, np.result_type(x.dtype, w.dtype))
    cached = memo.get(("band", key))
    if cached is None or cached[0] is not w:
        cached = memo[("band", key)] = (w, plan.band(w.astype(plan.dtype, copy=False)))
    return plan.run(x, cached[1], bias, epilogue)
