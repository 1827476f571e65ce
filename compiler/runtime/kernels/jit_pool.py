"""Compiled (numba, see runtime/jit.py) 2-D MaxPool / AveragePool for float32 and float64.

The NumPy path (pool.py) pads a copy of the input and makes one whole-tensor pass per kernel tap;
on a ResNet stem's 3x3 stride-2 max pool that is 7-13x onnxruntime's time. Here each plane is first
copied into a padded scratch split into stride phases (row h of the padded plane goes to row phase
h mod sh, column w to column phase w mod sw), so that for every kernel tap the inputs of all output
positions sit at one constant offset: out[oh * L + ow] reads phases[base + oh * L + ow]. A tap is
then one unit-stride loop over the whole output plane (L = the phase width, a few columns wider
than the output; the extra columns are dropped at the end), which LLVM vectorizes whatever the
stride, instead of a short loop per output row that stays scalar.

Padding is filled so that it cannot change a result. An average adds zeros (exact: a sum that
starts at +0 never becomes -0, and x + 0 == x otherwise) and divides by the taps counted (explicit
pads included with count_include_pad, the ceil_mode overhang never). A max's padding repeats image
values: a padded column left of the image holds the first image column on its dilation lattice,
which is the first real tap of any window reading it and follows the padding in the fold; one
right of the image holds the last, which precedes it; padded rows repeat whole rows the same way.
Folding `o if o >= v else v` over a run of taps twice gives what folding it once does, NaN and
signed zeros included, so the result is bit for bit that of skipping the padding. Windows with no
image position at all get -inf afterwards.

The max's NaN rule: a NaN tap makes the result NaN until a later tap replaces it (that fold).
onnxruntime's MLAS kernel does not follow it everywhere (taps 1, 2, NaN give it 2, here NaN), and
the NumPy path keeps any NaN. Planes are split between the caller and the helper thread when the
input is large.
"""

from __future__ import annotations

import numpy as np

from ..jit import jit
from .common import over_planes

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
UINT = np.uint64  # index type of the hot loops (see the note before the plane loop)
# positions a tap pass covers before the next tap's: that much of acc stays in L1 across the taps
# (whole-plane passes over a 2048x2048 plane would stream it from memory once per tap)
CHUNK = 2048
MAX_SCRATCH_GROWTH = 4  # the padded scratch of a plane may be this many times the plane, no more


@jit
def _pool_planes(x, kernel, strides, dilations, pads_begin, count_low, count_high, is_max, y):
    """y [P, OH, OW] = the pool of x [P, H, W]; count_low/high: per axis, the input range whose
    positions an average counts (the explicit pads included or not); for a max, the image: a window
    with none of it is all padding."""
    planes, height, width = x.shape
    out_h, out_w = y.shape[1], y.shape[2]
    kh, kw = kernel[0], kernel[1]
    sh, sw = strides[0], strides[1]
    dh, dw = dilations[0], dilations[1]
    ph, pw = pads_begin[0], pads_begin[1]
    t = x.dtype.type
    start = t(-np.inf) if is_max else t(0)
    rows, cols = np.empty(out_h, np.int64), np.empty(out_w, np.int64)
    for oh in range(out_h):
        top = oh * sh - ph
        rows[oh] = max(0, min(kh - 1, (count_high[0] - 1 - top) // dh) - max(0, -((top - count_low[0]) // dh)) + 1)
    for ow in range(out_w):
        left = ow * sw - pw
        cols[ow] = max(0, min(kw - 1, (count_high[1] - 1 - left) // dw) - max(0, -((left - count_low[1]) // dw)) + 1)
    # only the taps that reach the image for some output position: the others read padding
    # everywhere, and a window far larger than the image (EfficientNet's AvgPool(1280, ceil_mode)
    # over 7x7) must not cost a pass per tap
    i0 = max(0, -((ph - (out_h - 1) * sh) // -dh))
    i1 = max(i0, min(kh, (height - 1 + ph) // dh + 1))
    j0 = max(0, -((pw - (out_w - 1) * sw) // -dw))
    j1 = max(j0, min(kw, (width - 1 + pw) // dw + 1))
    if i0 == i1 or j0 == j1:  # every window is all padding
        y[:] = start
        return
    top0, left0 = ph - i0 * dh, pw - j0 * dw  # padded position = image position + (top0, left0)
    num_rows = out_h + (i1 - 1 - i0) * dh // sh  # of a phase
    num_cols = out_w + (j1 - 1 - j0) * dw // sw
    size = num_rows * num_cols
    span = (out_h - 1) * num_cols + out_w
    phases, acc = np.empty(sh * sw * size, x.dtype), np.empty(span, x.dtype)
    offsets = np.empty((i1 - i0) * (j1 - j0), UINT)  # per tap, in row-major order
    for i in range(i1 - i0):
        for j in range(j1 - j0):
            a, b = i * dh, j * dw
            offsets[i * (j1 - j0) + j] = ((a % sh) * sw + b % sw) * size + a // sh * num_cols + b // sw
    # Where the fill puts each row and column, worked out once: the integer divisions cost more
    # than the copies they place. A max's padding repeats the nearest image row or column on its
    # dilation lattice (module docstring); -1 where there is none, and for an average's zeros.
    row_src, row_at = np.empty(num_rows * sh, np.int64), np.empty(num_rows * sh, UINT)
    for h in range(num_rows * sh):
        r = h - top0
        if r < 0 or r >= height:
            r = (r % dh if r < 0 else r - (r - height + dh) // dh * dh) if is_max else -1
        row_src[h] = r if 0 <= r < height else -1
        row_at[h] = (h % sh) * sw * size + h // sh * num_cols
    # Column phase q holds image columns q + k * sw - left0 at k = 0 .. num_cols - 1; [k_lo, k_hi)
    # is inside the image in every phase and copied in bulk, the rest (the edges) one by one.
    k_lo, k_hi = 0, num_cols
    for q in range(sw):
        k_lo = max(k_lo, -((q - left0) // sw))
        k_hi = min(k_hi, (width - 1 + left0 - q) // sw + 1)
    k_lo = min(k_lo, num_cols)
    k_hi = max(k_lo, k_hi)
    first = k_lo * sw - left0  # the image column at phase 0, k_lo
    edge_at = np.empty(sw * (num_cols - k_hi + k_lo), UINT)
    edge_src = np.empty(sw * (num_cols - k_hi + k_lo), np.int64)
    e = 0
    for q in range(sw):
        for k in range(num_cols):
            if k_lo <= k < k_hi:
                continue
            c = q + k * sw - left0
            if c < 0 or c >= width:
                c = (c % dw if c < 0 else c - (c - width + dw) // dw * dw) if is_max else -1
            edge_at[e], edge_src[e] = q * size + k, c if 0 <= c < width else -1
            e += 1
    # Unsigned indices below: numba wraps a negative signed index around, and that check on every
    # access turns the copies into gathers and keeps LLVM from vectorizing the tap loops.
    flat, pooled = x.reshape(x.size), y.reshape(y.size)
    num_bulk = UINT(k_hi - k_lo)
    for p in range(planes):
        for h in range(num_rows * sh):
            at, r = row_at[h], row_src[h]
            if r < 0:
                for q in range(sw):
                    for k in range(UINT(num_cols)):
                        phases[at + UINT(q * size) + k] = start
                continue
            src, dst = UINT((p * height + r) * width + first), at + UINT(k_lo)
            if sw == 1:
                for k in range(num_bulk):
                    phases[dst + k] = flat[src + k]
            elif sw == 2:  # both phases in one loop: LLVM de-interleaves with shuffles
                dst_odd = dst + UINT(size)
                for k in range(num_bulk):
                    phases[dst + k] = flat[src + k + k]
                    phases[dst_odd + k] = flat[src + k + k + UINT(1)]
            else:
                for q in range(sw):
                    for k in range(num_bulk):
                        phases[dst + UINT(q * size) + k] = flat[src + UINT(q) + k * UINT(sw)]
            row = UINT((p * height + r) * width)
            for edge in range(len(edge_at)):
                c = edge_src[edge]
                phases[at + edge_at[edge]] = flat[row + UINT(c)] if c >= 0 else start
        for chunk in range(0, span, CHUNK):
            head, length = UINT(chunk), UINT(min(CHUNK, span - chunk))
            for tap in range(len(offsets)):
                at = offsets[tap] + head
                if tap == 0 and is_max:  # -inf folded with v is v, bit for bit
                    for f in range(length):
                        acc[head + f] = phases[at + f]
                elif tap == 0:  # 0 + v, not v: a sum starting at +0 turns -0 into +0
                    for f in range(length):
                        acc[head + f] = start + phases[at + f]
                elif is_max:  # a select, not a branch: random data mispredicts a branch half the time
                    for f in range(length):
                        v = phases[at + f]
                        o = acc[head + f]
                        acc[head + f] = o if o >= v else v  # noqa: FURB136 - numba compiles max() slower
                else:
                    for f in range(length):
                        acc[head + f] += phases[at + f]
        for oh in range(out_h):
            line, out = UINT(oh * num_cols), UINT((p * out_h + oh) * out_w)
            if is_max:  # windows with no image position: -inf, not the padding's copies
                for ow in range(UINT(out_w)):
                    pooled[out + ow] = acc[line + ow] if rows[oh] * cols[ow] else start
            else:  # divided by the taps counted (explicit pads with count_include_pad)
                for ow in range(UINT(out_w)):
                    count = rows[oh] * cols[ow]
                    pooled[out + ow] = acc[line + ow] / t(count) if count else t(0)


def pool2d(x: np.ndarray, kernel, geo, is_max: bool, count_include_pad: bool = False) -> np.ndarray | None:
    """The 2-D pool of x (N, C, H, W) with the geometry of conv.geometry, or None where the compiled
    path does not apply (the caller takes the NumPy path)."""
    compiled = _pool_planes.get()
    if compiled is None or x.ndim != 4 or x.dtype not in FLOATS or not x.size or not all(geo.out):
        return None
    n, c, height, width = x.shape
    (out_h, out_w), (kh, kw) = geo.out, kernel
    span_h = (out_h - 1) * geo.strides[0] + (kh - 1) * geo.dilations[0] + 1
    span_w = (out_w - 1) * geo.strides[1] + (kw - 1) * geo.dilations[1] + 1
    if span_h * span_w > MAX_SCRATCH_GROWTH * height * width + 4096:
        # windows far larger than the image (EfficientNet's AvgPool(1280) over 7x7 with ceil_mode):
        # the padded phase scratch would be mostly padding; the NumPy path reduces each window
        return None
    planes = np.ascontiguousarray(x).reshape(n * c, height, width)
    y = np.empty((n * c,) + tuple(geo.out), dtype=x.dtype)
    spatial = (height, width)
    if count_include_pad:
        low = np.array([-b for b in geo.pads_begin], np.int64)
        high = np.array([s + e for s, e in zip(spatial, geo.pads_end)], np.int64)
    else:
        low, high = np.zeros(2, np.int64), np.array(spatial, np.int64)
    args = (np.array(kernel, np.int64), np.array(geo.strides, np.int64), np.array(geo.dilations, np.int64),
            np.array(geo.pads_begin, np.int64), low, high, is_max)
    over_planes(compiled, planes, args, y, x.nbytes)
    return y.reshape((n, c) + tuple(geo.out))
