"""Dense (group 1) stride-1 2-D convolutions as one GEMM per kernel tap, without im2col.

In the phase layout (im2col.Layout) a stride-1 convolution has one phase: the padded image of each
channel is one flat plane, and kernel tap (i, j) reads that plane shifted by i*dh*cols + j*dw. For a
chunk of wide output positions, the tap's input is a (C, chunk) strided view BLAS reads in place:

    y[:, chunk] = sum over taps t of W_t (M x C) @ plane[:, chunk + offset_t]

one GEMM per tap into a scratch block added to the output while both are in cache. Against im2col
this trades copying C*taps rows (written, then read by the GEMM) for (taps - 1) adds of M rows
(two reads, one write each): the better deal when the convolution narrows its channels, as the
detection heads' 3x3 convolutions do.
"""

from __future__ import annotations

import numpy as np

from .common import parallel_for
from .im2col import layout_for, pooled

CHUNK = 4096  # wide output positions per block: the C x CHUNK input window stays in L2 across taps


def prefers_taps(c: int, m: int, taps: int) -> bool:
    return taps > 1 and 2 * c * taps > 3 * (taps - 1) * m


def _tap_weights(w: np.ndarray, memo: dict) -> np.ndarray:
    cached = memo.get("tap-weights")
    if cached is None or cached[0] is not w:
        m, c, kh, kw = w.shape
        cached = memo["tap-weights"] = (w, np.ascontiguousarray(w.transpose(2, 3, 0, 1)).reshape(kh * kw, m, c))
    return cached[1]


def dense2d_taps(x, w, bias, pads_begin, pads_end, out, memo: dict, epilogue=None) -> np.ndarray:
    """Group 1, stride 1, dilation 1. `epilogue(block)` runs in place on each (M, positions) block
    of wide output rows once it is complete (an activation)."""
    n, c = x.shape[:2]
    m, _, kh, kw = w.shape
    layout = layout_for(memo, x.shape, (kh, kw), (1, 1), pads_begin, pads_end, out)
    planes = layout.planes(x)[0]  # (n*c, plane + slack)
    weights = _tap_weights(w, memo)
    offsets = [i * layout.cols + j for i in range(kh) for j in range(kw)]
    column = None if bias is None else bias.reshape(m, 1)
    wide = layout.wide_buffer((n, m, layout.length), np.result_type(x.dtype, w.dtype))
    items = [(image, start, min(start + CHUNK, layout.length)) for image in range(n)
             for start in range(0, layout.length, CHUNK)]

    def run(index):
        image, start, stop = items[index]
        rows = planes[image * c:(image + 1) * c]
        target = wide[image, :, start:stop]
        np.matmul(weights[0], rows[:, start + offsets[0]:stop + offsets[0]], out=target)
        if len(offsets) > 1:
            partial = pooled("taps", m * CHUNK, wide.dtype)[:m * (stop - start)].reshape(m, stop - start)
            for tap in range(1, len(offsets)):
                offset = offsets[tap]
                np.matmul(weights[tap], rows[:, start + offset:stop + offset], out=partial)
                target += partial
        if column is not None:
            target += column
        if epilogue is not None:
            epilogue(target)

    parallel_for(len(items), run, x.nbytes + wide.nbytes)
    return layout.crop(wide.reshape(n * m, -1), n, m)
