"""Fast 2-D convolution paths over a "flat phase" layout of the padded input.

The padded image of each channel is split into stride x stride phases (one phase when the stride is
1), each stored as a flat row-major plane with a little slack at the end. In that layout every kernel
tap is a contiguous slice at a fixed offset, and all taps of one phase form a regular grid of offsets,
so one `as_strided` view per phase copies them into im2col columns for a block of channels and a
chunk of output positions. Outputs are computed on the phase's full width ("wide" rows); the extra
columns are cropped when the bias is added. Blocks are sized so the columns stay in cache between
their copy and the BLAS call that reads them.

- depthwise: columns (b, taps, chunk), one batched matrix-vector product with the per-channel taps.
- dense (group 1): columns (C*taps, chunk), one GEMM per chunk (all images at once when small).

A `Layout` depends on shapes only; kernels keep it, and the weights reordered for it, in the step's
memo so repeated runs skip that Python work.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

CACHE_BYTES = 1 << 20  # im2col block (bytes) kept in cache between its copy and its BLAS call (tuned on 2 cores)
MIN_GEMM_WIDTH = 4096  # dense convs: narrower GEMMs lose more to BLAS overheads than cache misses cost


class Layout:
    """Where each input row/column lands in the phase planes, and which taps each phase serves."""

    def __init__(self, x_shape, kernel, strides, pads_begin, pads_end, out):
        n, c, h, w = x_shape
        (kh, kw), (sh, sw), (pt, pl), (pb, pr) = kernel, strides, pads_begin, pads_end
        self.images, self.channels = n, c
        self.out_h, self.out_w = out
        self.rows = max(math.ceil((h + pt + pb) / sh), self.out_h + (kh - 1) // sh)
        self.cols = max(math.ceil((w + pl + pr) / sw), self.out_w + (kw - 1) // sw)
        self.length = self.out_h * self.cols  # wide output positions
        self.num_phases = sh * sw
        self.plane = self.rows * self.cols
        self.slack = ((kh - 1) // sh) * self.cols + (kw - 1) // sw + 1
        self.groups = []  # (phase, taps_h, taps_w): the taps of a phase form a grid of offsets
        self.order = []  # kernel taps (row-major index) in the order the columns list them
        for ph in range(min(sh, kh)):
            for pw in range(min(sw, kw)):
                rows_k, cols_k = range(ph, kh, sh), range(pw, kw, sw)
                self.groups.append((ph * sw + pw, len(rows_k), len(cols_k)))
                self.order += [r * kw + q for r in rows_k for q in cols_k]
        self.is_natural_order = self.order == list(range(kh * kw))
        self.fills = []  # (phase, target rows, target cols, source rows, source cols)
        for ph in range(sh):
            for pw in range(sw):
                i0, j0 = (ph - pt) % sh, (pw - pl) % sw  # first input row / column landing in this phase
                r0, q0 = (i0 + pt - ph) // sh, (j0 + pl - pw) // sw
                rows = min(len(range(i0, h, sh)), self.rows - r0)
                cols = min(len(range(j0, w, sw)), self.cols - q0)
                if rows > 0 and cols > 0:
                    self.fills.append((ph * sw + pw, slice(r0, r0 + rows), slice(q0, q0 + cols),
                                       slice(i0, i0 + (rows - 1) * sh + 1, sh), slice(j0, j0 + (cols - 1) * sw + 1, sw)))

    def planes(self, x: np.ndarray) -> np.ndarray:
        n, c, h, w = x.shape
        data = np.zeros((self.num_phases, n * c, self.plane + self.slack), dtype=x.dtype)
        source = x.reshape(n * c, h, w)
        for phase, rows, cols, src_rows, src_cols in self.fills:
            target = data[phase, :, :self.plane].reshape(n * c, self.rows, self.cols)
            target[:, rows, cols] = source[:, src_rows, src_cols]
        return data

    def columns(self, data, scratch: np.ndarray, channels: slice, start: int, stop: int, ones: bool) -> np.ndarray:
        """(b, taps [+ 1], stop - start) columns of `channels` for wide positions [start, stop), in
        scratch; with `ones`, a last row of ones carries the bias through the BLAS call."""
        b, width = channels.stop - channels.start, stop - start
        rows = len(self.order) + ones
        out = scratch[:b * rows * width].reshape(b, rows, width)
        if ones:
            out[:, -1] = 1
        offset = 0
        for phase, taps_h, taps_w in self.groups:
            plane = data[phase, channels, start:]
            s_c, s_e = plane.strides
            view = as_strided(plane, (b, taps_h, taps_w, width), (s_c, self.cols * s_e, s_e, s_e))
            np.copyto(out[:, offset:offset + taps_h * taps_w].reshape(b, taps_h, taps_w, width), view)
            offset += taps_h * taps_w
        return out

    def crop(self, wide: np.ndarray, n: int, channels: int) -> np.ndarray:
        """(n*channels, L) wide rows -> (n, channels, out_h, out_w)."""
        if self.cols == self.out_w:
            return wide.reshape(n, channels, self.out_h, self.out_w)
        out = np.empty((n, channels, self.out_h, self.out_w), dtype=wide.dtype)
        np.copyto(out, wide.reshape(n, channels, self.out_h, self.cols)[..., :self.out_w])
        return out

    def reordered(self, w: np.ndarray, bias, memo: dict, depthwise: bool) -> np.ndarray:
        """Weights as (N*C, 1, taps [+ bias]) for depthwise, (M, C*taps [+ bias]) for dense; cached
        while the same weight and bias arrays come back."""
        cached = memo.get("weights")
        if cached is not None and cached[0] is w and cached[1] is bias:
            return cached[2]
        m = w.shape[0]
        taps = w.reshape(m, w.shape[1], -1)
        if not self.is_natural_order:
            taps = taps[:, :, self.order]
        taps = taps.reshape(m, -1)
        if bias is not None:
            taps = np.concatenate([taps, bias.reshape(m, 1).astype(taps.dtype)], axis=1)
        if depthwise:
            taps = taps.reshape(m, 1, -1)
            taps = np.tile(taps, (self.images, 1, 1)) if self.images > 1 else taps
        result = np.ascontiguousarray(taps)
        memo["weights"] = (w, bias, result)
        return result


def layout_for(memo: dict, x_shape, kernel, strides, pads_begin, pads_end, out) -> Layout:
    key = (x_shape, tuple(kernel), tuple(strides), tuple(pads_begin), tuple(pads_end))
    layout = memo.get(key)
    if layout is None:
        if len(memo) > 32:  # shapes keep changing: start over
            memo.clear()
        layout = memo[key] = Layout(x_shape, kernel, strides, pads_begin, pads_end, out)
    return layout


def _chunks(total: int, size: int):
    for start in range(0, total, size):
        yield start, min(start + size, total)


def depthwise2d(x, w, bias, strides, pads_begin, pads_end, out, memo: dict) -> np.ndarray:
    """One channel per group (w: (C, 1, kh, kw)), dilation 1."""
    n, c = x.shape[:2]
    layout = layout_for(memo, x.shape, w.shape[2:], strides, pads_begin, pads_end, out)
    data = layout.planes(x)
    weights = layout.reordered(w, bias, memo, depthwise=True)
    ones = bias is not None
    taps = len(layout.order) + ones
    budget = CACHE_BYTES // (taps * x.itemsize)  # channel-positions per block
    width = min(layout.length, max(budget, 64))
    block = max(1, min(n * c, budget // width))
    scratch = np.empty(block * taps * width, dtype=x.dtype)
    wide = np.empty((n * c, 1, layout.length), dtype=x.dtype)
    for first, last in _chunks(n * c, block):
        channels = slice(first, last)
        for start, stop in _chunks(layout.length, width):
            np.matmul(weights[channels], layout.columns(data, scratch, channels, start, stop, ones),
                      out=wide[channels, :, start:stop])
    return layout.crop(wide, n, c)


def dense2d(x, w, bias, strides, pads_begin, pads_end, out, memo: dict) -> np.ndarray:
    """Group 1, dilation 1."""
    n, c = x.shape[:2]
    m = w.shape[0]
    layout = layout_for(memo, x.shape, w.shape[2:], strides, pads_begin, pads_end, out)
    data = layout.planes(x)
    weights = layout.reordered(w, bias, memo, depthwise=False)
    ones = bias is not None
    taps = len(layout.order)
    rows = c * taps
    if n * rows * layout.length * x.itemsize <= 4 * CACHE_BYTES:  # small: all images, one call
        scratch = np.empty(n * rows * layout.length, dtype=x.dtype)
        cols = layout.columns(data, scratch, slice(0, n * c), 0, layout.length, False).reshape(n, rows, layout.length)
        wide = np.matmul(weights[:, :rows], cols)
        if ones:
            wide += bias.reshape(1, m, 1)
        return layout.crop(wide.reshape(n * m, -1), n, m)
    width = min(layout.length, max(MIN_GEMM_WIDTH, 16 * CACHE_BYTES // (rows * x.itemsize)))
    scratch = np.empty((rows + 1) * width, dtype=x.dtype)
    wide = np.empty((n, m, layout.length), dtype=x.dtype)
    part = np.empty((m, width), dtype=x.dtype)
    for image in range(n):
        channels = slice(image * c, (image + 1) * c)
        for start, stop in _chunks(layout.length, width):
            cols = layout.columns(data, scratch, channels, start, stop, False).reshape(rows, stop - start)
            if ones:  # the bias row: `columns` filled rows [0, rows) of this contiguous block
                cols = scratch[:(rows + 1) * (stop - start)].reshape(rows + 1, stop - start)
                cols[rows] = 1
            if stop - start == width:
                np.matmul(weights, cols, out=part)
                wide[image, :, start:stop] = part
            else:
                wide[image, :, start:stop] = weights @ cols
    return layout.crop(wide.reshape(n * m, -1), n, m)
