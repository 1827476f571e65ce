"""Fast 2-D convolution paths over a "flat phase" layout of the padded input.

The padded image of each channel is split into stride x stride phases (one phase when the stride is
1), each stored as a flat row-major plane with a little slack at the end. In that layout every kernel
tap is a contiguous slice at a fixed offset, and all taps of one phase form a regular grid of offsets,
so one `as_strided` view per phase copies them into im2col columns for a block of channels and a
chunk of output positions. Outputs are computed on the phase's full width ("wide" rows); the extra
columns are cropped when the bias is added. Blocks are sized so the columns stay in cache between
their copy and the BLAS call that reads them.

Dense convolutions (group 1): columns (C*taps, chunk), one GEMM per chunk (all images at once when
small). Depthwise convolutions have their own path (depthwise.py).

A `Layout` depends on shapes only; kernels keep it, and the weights reordered for it, in the step's
memo so repeated runs skip that Python work. Small phase planes stay allocated between runs with
their column views built once; column scratch comes from a per-thread pool; the GEMM blocks of a
dense convolution are shared with the helper thread (gemm_impls.parallel_for); blocks may take an
epilogue (the fused activation) while they are in cache.
"""

from __future__ import annotations

import math
import threading

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .. import aligned
from ..gemm_impls import SPLIT_MIN_MACS, product_into
from .common import parallel_for

KEEP_BYTES = 1 << 23  # phase planes up to this size stay allocated between runs (per step)
CACHE_BYTES = 1 << 20  # im2col block (bytes) kept in cache between its copy and its BLAS call (tuned on 2 cores)
MIN_GEMM_WIDTH = 4096  # dense convs: narrower GEMMs lose more to BLAS overheads than cache misses cost


_POOL = threading.local()


def pooled(name: str, size: int, dtype) -> np.ndarray:
    """A flat scratch buffer of at least `size` elements, shared by every kernel call of the thread
    that asks for the same name (calls run one after the other); it grows, never shrinks. Large
    ones are on huge pages where the kernel grants them (aligned.py)."""
    buffers = _POOL.__dict__.setdefault("buffers", {})
    key = (name, np.dtype(dtype))
    buffer = buffers.get(key)
    if buffer is None or buffer.size < size:
        buffer = buffers[key] = aligned.empty(max(size, 1), dtype, huge=True)
    return buffer


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
        self._data = None  # the kept phase planes (see `planes`)
        self._views: dict = {}  # column copies over the kept planes: chunk -> (scratch, (columns, [(target, view)]))
        self._fill_targets: list = []
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
        """The phase planes of x, one row per (image, channel). Up to KEEP_BYTES they live in a
        buffer kept between runs: its padding and slack are zeroed once and never written, so a run
        only copies the interior in, and the column views over it are built once (see `columns`)."""
        n, c, h, w = x.shape
        shape = (self.num_phases, n * c, self.plane + self.slack)
        keep = math.prod(shape) * x.itemsize <= KEEP_BYTES
        data = self._data if keep and self._data is not None and self._data.dtype == x.dtype else None
        if data is None:
            data = np.zeros(shape, dtype=x.dtype)
            self._views.clear()
            self._fill_targets = [(data[phase, :, :self.plane].reshape(n * c, self.rows, self.cols)[:, rows, cols],
                                   (slice(None), src_rows, src_cols)) for phase, rows, cols, src_rows, src_cols in self.fills]
            self._data = data if keep else None
        source = x.reshape(n * c, h, w)
        for target, index in self._fill_targets:
            np.copyto(target, source[index])
        return data

    def columns(self, data, scratch: np.ndarray, channels: slice, start: int, stop: int, ones: bool) -> np.ndarray:
        """(b, taps [+ 1], stop - start) columns of `channels` for wide positions [start, stop), in
        scratch; with `ones`, a last row of ones carries the bias through the BLAS call."""
        key = (channels.start, channels.stop, start, stop, ones, threading.get_ident())
        cached = self._views.get(key) if data is self._data else None
        if cached is None or cached[0] is not scratch:
            cached = (scratch, self._column_views(data, scratch, channels, start, stop, ones))
            if data is self._data:
                self._views[key] = cached
        out, copies = cached[1]
        if ones:  # the pooled scratch is shared with other steps: the row of ones is rewritten every call
            out[:, -1] = 1
        for target, view in copies:
            np.copyto(target, view)
        return out

    def _column_views(self, data, scratch, channels: slice, start: int, stop: int, ones: bool):
        b, width = channels.stop - channels.start, stop - start
        rows = len(self.order) + ones
        out = scratch[:b * rows * width].reshape(b, rows, width)
        copies, offset = [], 0
        for phase, taps_h, taps_w in self.groups:
            plane = data[phase, channels, start:]
            s_c, s_e = plane.strides
            view = as_strided(plane, (b, taps_h, taps_w, width), (s_c, self.cols * s_e, s_e, s_e))
            copies.append((out[:, offset:offset + taps_h * taps_w].reshape(b, taps_h, taps_w, width), view))
            offset += taps_h * taps_w
        return out, copies

    def scratch(self, size: int, dtype) -> np.ndarray:
        """A buffer for columns (it never leaves the kernel), from the thread's pool."""
        return pooled("columns", size, dtype)

    def wide_buffer(self, shape, dtype) -> np.ndarray:
        """The wide output rows: a pooled buffer when `crop` copies out of it, else the fresh output."""
        if self.cols == self.out_w:
            return np.empty(shape, dtype)
        return pooled("wide", math.prod(shape), dtype)[:math.prod(shape)].reshape(shape)

    def crop(self, wide: np.ndarray, n: int, channels: int) -> np.ndarray:
        """(n*channels, L) wide rows -> (n, channels, out_h, out_w)."""
        if self.cols == self.out_w:
            return wide.reshape(n, channels, self.out_h, self.out_w)
        out = np.empty((n, channels, self.out_h, self.out_w), dtype=wide.dtype)
        np.copyto(out, wide.reshape(n, channels, self.out_h, self.cols)[..., :self.out_w])
        return out

    def reordered(self, w: np.ndarray, bias, memo: dict) -> np.ndarray:
        """Weights as (M, C*taps [+ bias]); cached while the same weight and bias arrays come back."""
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


def _shared_product(weights: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """weights @ cols[i] for each image: one image's GEMM in row or column blocks shared with the
    helper thread (product_into), several images split between the two threads. A 3x3 convolution
    of a batch-1 ResNet stage is one GEMM of ~0.2 GFLOP: on one BLAS thread it ran at half
    onnxruntime's speed, which uses both cores."""
    n, length = cols.shape[0], cols.shape[2]
    if n == 1:
        return product_into(weights, cols[0]).reshape(1, weights.shape[0], length)
    wide = np.empty((n, weights.shape[0], length), np.result_type(weights.dtype, cols.dtype))
    if weights.shape[0] * cols[0].size < SPLIT_MIN_MACS:
        return np.matmul(weights, cols, out=wide)
    parallel_for(n, lambda image: np.matmul(weights, cols[image], out=wide[image]))
    return wide


def dense2d(x, w, bias, strides, pads_begin, pads_end, out, memo: dict, epilogue=None) -> np.ndarray:
    """Group 1, dilation 1. `epilogue(block)`, when given, runs in place on each (M, positions)
    block of wide output rows right after its product, while it is in cache (an activation); large
    convolutions share their (column copy + GEMM) blocks with the helper thread."""
    n, c = x.shape[:2]
    m = w.shape[0]
    layout = layout_for(memo, x.shape, w.shape[2:], strides, pads_begin, pads_end, out)
    data = layout.planes(x)
    weights = layout.reordered(w, bias, memo)
    ones = bias is not None
    taps = len(layout.order)
    rows = c * taps
    if n * rows * layout.length * x.itemsize <= 4 * CACHE_BYTES:  # small: all images, one call
        scratch = layout.scratch(n * rows * layout.length, x.dtype)
        cols = layout.columns(data, scratch, slice(0, n * c), 0, layout.length, False).reshape(n, rows, layout.length)
        wide = _shared_product(weights[:, :rows], cols)
        if ones:
            wide += bias.reshape(1, m, 1)
        if epilogue is not None:
            epilogue(wide)
        return layout.crop(wide.reshape(n * m, -1), n, m)
    width = min(layout.length, max(MIN_GEMM_WIDTH, 16 * CACHE_BYTES // (rows * x.itemsize)))
    wide = layout.wide_buffer((n, m, layout.length), x.dtype)
    items = [(image, start, stop) for image in range(n) for start, stop in _chunks(layout.length, width)]

    def run(index):
        image, start, stop = items[index]
        scratch = layout.scratch((rows + 1) * width, x.dtype)
        cols = layout.columns(data, scratch, slice(image * c, (image + 1) * c), start, stop, False).reshape(rows, stop - start)
        if ones:  # the bias row: `columns` filled rows [0, rows) of this contiguous block
            cols = scratch[:(rows + 1) * (stop - start)].reshape(rows + 1, stop - start)
            cols[rows] = 1
        target = wide[image, :, start:stop]
        if len(items) == 1:  # one block (a batch-1 map): its GEMM is shared with the helper thread instead
            product_into(weights, cols, out=target)
        else:
            np.matmul(weights, cols, out=target)  # unit-stride rows: BLAS writes the slice with ldc = L
        if epilogue is not None:
            epilogue(target)

    parallel_for(len(items), run, n * rows * layout.length * x.itemsize)
    return layout.crop(wide.reshape(n * m, -1), n, m)


SMALL_BYTES = 1 << 21  # strided convolutions with columns up to this size: one whole-tensor copy


class SmallConv:
    """Whole-tensor im2col for small dense 2-D convolutions (any stride and dilation).

    The padded input lives in a buffer kept between runs (its border stays zero, only the interior
    is rewritten) and the windows are a strided view of it built once, so a run is four NumPy calls:
    copy in, copy the windows out, one GEMM, bias. Strided convolutions with few channels take this
    path: the phased layout would copy each phase separately."""

    def __init__(self, x_shape, kernel, geo, dtype):
        n, c, h, w = x_shape
        (kh, kw), (sh, sw), (dh, dw) = kernel, geo.strides, geo.dilations
        (pt, pl), (pb, pr), (oh, ow) = geo.pads_begin, geo.pads_end, geo.out
        self.n, self.out = n, (oh, ow)
        self.padded = np.zeros((n, c, h + pt + pb, w + pl + pr), dtype)
        self.interior = self.padded[:, :, pt:pt + h, pl:pl + w]
        s_n, s_c, s_y, s_x = self.padded.strides
        shape, strides = (n, c, kh, kw, oh, ow), (s_n, s_c, s_y * dh, s_x * dw, s_y * sh, s_x * sw)
        self.windows = np.ndarray(shape, dtype, self.padded, 0, strides)
        self.columns = np.empty(shape, dtype)
        self.matrix = self.columns.reshape(n, c * kh * kw, oh * ow)

    def __call__(self, x: np.ndarray, w: np.ndarray, bias) -> np.ndarray:
        np.copyto(self.interior, x)
        np.copyto(self.columns, self.windows)
        m = w.shape[0]
        y = np.matmul(w.reshape(m, -1), self.matrix)
        if bias is not None:
            y += bias.reshape(m, 1)
        return y.reshape(self.n, m, *self.out)


def small_conv(x, w, bias, kernel, geo, memo: dict) -> np.ndarray:
    key = ("small", x.shape, x.dtype, tuple(kernel), geo)
    runner = memo.get(key)
    if runner is None:
        if len(memo) > 32:
            memo.clear()
        runner = memo[key] = SmallConv(x.shape, kernel, geo, x.dtype)
    return runner(x, w, bias)


def small_enough(x_shape, kernel, geo, itemsize: int) -> bool:
    n, c = x_shape[:2]
    return n * c * math.prod(kernel) * math.prod(geo.out) * itemsize <= SMALL_BYTES
