"""Compiled (numba, see runtime/jit.py) convolution kernels for small tensors, where NumPy's cost is
its calls: direct depthwise and grouped convolution (_direct), phase-layout im2col for small dense
convolutions (_wide_columns, then one BLAS GEMM), and one pass of bias + activation over a GEMM's
output (_bias_activation, _crop).

Every entry point returns None (or False) when it does not handle the case (compiled kernels off,
a dtype or layout it does not take, a size it does not pay off at), and the caller then takes its
NumPy path.

Activations: an epilogue that is a `FusedActivation` (an activation code and two parameters) runs
inside the compiled pass over each output block; any other epilogue callable runs on each block
after it is computed, as on the NumPy paths.

Arithmetic stays in the data's dtype (float32 accumulates in float32, as the BLAS paths do); NaN and
Inf propagate as in NumPy: the activations compare with `<`/`>` so a NaN passes through unchanged.
"""
# ruff: noqa: FURB136 - min()/max() would not keep a NaN (the selects do)

from __future__ import annotations

import math
import threading

import numpy as np

from ..jit import jit
from . import jit_activation as _jit_activation
from .common import parallel_for

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
BLOCK_BYTES = 1 << 17  # output planes per job: the block stays in L2 for the epilogue (and splits across cores)

PARALLEL_BYTES = 1 << 22  # direct convolution jobs go to the helper thread from this much input + output on
SMALL_PLANE = 4096  # elements: _direct activates such output planes in one call, larger ones by row

# activation codes (the compiled kernels' `act`); + AFFINE: then y * scale + shift
IDENTITY, RELU, CLIP, HARD_SIGMOID, HARD_SWISH, LEAKY_RELU, SILU = range(7)
AFFINE = 16
# SILU: x * sigmoid(alpha x) = x * (tanh(alpha x / 2) / 2 + 1 / 2), tanh by jit_activation's rational
# fit (the same formula and order as the compiled QuickGelu, so fusing it changes no result)
_TANH_P, _TANH_Q, _TANH_CLAMP = _jit_activation._TANH_P, _jit_activation._TANH_Q, 9.0


class FusedActivation:
    """An in-place elementwise epilogue the compiled kernels apply themselves: activation `code`
    with `params` = (alpha, beta) or (low, high), then, when `affine` = (scale, shift) is given,
    y * scale + shift. Called on a block it runs `numpy_form` (the NumPy paths' way), so it stays a
    drop-in `epilogue(block)`."""

    __slots__ = ("_arrays", "code", "numpy_form", "params")

    def __init__(self, code: int, params, numpy_form, affine=None):
        self.code = code + (AFFINE if affine is not None else 0)
        scale, shift = affine if affine is not None else (1.0, 0.0)
        self.params = (float(params[0]), float(params[1]), 0.0, 1.0, float(scale), float(shift))
        self.numpy_form = numpy_form
        self._arrays: dict = {}

    def __call__(self, block: np.ndarray) -> None:
        self.numpy_form(block)

    def param_array(self, dtype) -> np.ndarray:
        """`params` in the data's dtype (see _activate_row)."""
        array = self._arrays.get(dtype)
        if array is None:
            array = self._arrays[dtype] = np.array(self.params, dtype)
        return array


def activation_code(name: str, params) -> tuple[int, tuple] | None:
    """(code, params) of FusedConv's activation `name` (activation_params `params`, as conv.py's
    apply_activation reads them) when the compiled kernels know it, else None."""
    params = list(params or [])
    if name == "Relu":
        return RELU, (0.0, 0.0)
    if name == "Clip" and len(params) >= 2:
        return CLIP, (params[0], params[1])
    if name == "HardSigmoid":
        alpha, beta = (params or [0.2, 0.5])[:2]
        return HARD_SIGMOID, (alpha, beta)
    if name == "LeakyRelu":
        alpha = params[0] if params else 0.01
        return (LEAKY_RELU, (alpha, 0.0)) if 0 <= alpha <= 1 else None
    return None


@jit
def _activate_row(ys, start, count, act, params):
    """ys[start:start + count] (flat, unsigned indices) in place: activation `act % AFFINE`, then
    from `act >= AFFINE` on, y * scale + shift. params = (alpha or low, beta or high, 0, 1, scale,
    shift) in the data's dtype, so the arithmetic stays in it (a literal would make float32 math
    float64)."""
    a, b, zero, one = params[0], params[1], params[2], params[3]
    base = act % AFFINE
    # selects, not min/max: a comparison with NaN is false, so NaN passes through
    if base == RELU:
        for q in range(count):
            v = ys[start + q]
            ys[start + q] = zero if v < zero else v
    elif base == CLIP:
        for q in range(count):
            v = ys[start + q]
            v = a if v < a else v
            ys[start + q] = b if v > b else v
    elif base == HARD_SIGMOID:
        for q in range(count):
            v = ys[start + q] * a + b
            v = zero if v < zero else v
            ys[start + q] = one if v > one else v
    elif base == HARD_SWISH:
        for q in range(count):
            x = ys[start + q]
            v = x * a + b
            v = zero if v < zero else v
            ys[start + q] = x * (one if v > one else v)
    elif base == LEAKY_RELU:
        for q in range(count):
            v = ys[start + q]
            t = v * a
            ys[start + q] = t if v < t else v
    elif base == SILU:  # a = alpha / 2, b = 1 / 2
        f = ys.dtype.type
        clamp = f(_TANH_CLAMP)
        p0, p1, p2, p3 = f(_TANH_P[0]), f(_TANH_P[1]), f(_TANH_P[2]), f(_TANH_P[3])
        p4, p5, p6 = f(_TANH_P[4]), f(_TANH_P[5]), f(_TANH_P[6])
        q0, q1, q2, q3 = f(_TANH_Q[0]), f(_TANH_Q[1]), f(_TANH_Q[2]), f(_TANH_Q[3])
        for q in range(count):
            v = ys[start + q]
            u = v * a
            u = -clamp if u < -clamp else u
            u = clamp if u > clamp else u
            u2 = u * u
            th = ((((((u2 * p0 + p1) * u2 + p2) * u2 + p3) * u2 + p4) * u2 + p5) * u2 + p6) * u / \
                (((u2 * q0 + q1) * u2 + q2) * u2 + q3)
            ys[start + q] = v * (th * b + b)
    if act >= AFFINE:
        scale, shift = params[4], params[5]
        for q in range(count):
            ys[start + q] = ys[start + q] * scale + shift


_activate_row_compiled = None  # what the kernels below call: _activate_row compiled (see _compiled)


@jit
def _bias_activation(y, bias, act, params, first, last, start, stop):
    """y[first:last, start:stop] of (N*M, P) output, in place: + bias[row % M] (unless bias is
    empty), then the activation."""
    u = np.uint64
    channels = bias.shape[0]
    width = u(y.shape[1])
    count = u(stop - start)
    ys = y.ravel()
    for p in range(first, last):
        begin = u(p) * width + u(start)
        if channels > 0:
            shift = bias[p % channels]
            for q in range(count):
                ys[begin + q] += shift
        if act != IDENTITY:
            _activate_row_compiled(ys, begin, count, act, params)


@jit
def _direct(x, w, bias, y, dims, pad, act, params, first, last):
    """Output planes [first, last) (plane = image * M + output channel) of a grouped convolution
    with few input channels per group (depthwise: one), computed directly: per group, GEMMs
    would be all call overhead.

    x (N, C, H, W), w (M, CG, KH, KW), bias (M,) (zeros when the node has none), y (N, M, OH, OW);
    dims = (stride h, w, dilation h, w, pad top, pad left, output channels per group); pad:
    scratch of (CG, stride w, H, S) elements, S = OW + (KW - 1) * dilation w // stride w, zero
    where no input lands (every call writes the same interior).

    The CG input planes of a group are copied once into `pad`, each split by column phase (column
    k of the padded row goes to phase k % stride, slot k // stride) with zeros around it, so every
    column tap reads one contiguous run of a phase row: no bounds in the inner loop, and it
    vectorizes. An output row starts from zero and adds, per input channel and kernel row inside
    the image, all the column taps in one pass (unrolled for 3 and 5 taps; a 3x3 kernel whose rows
    are all inside takes one pass for all 9); the bias comes last, in onnxruntime's order, which
    keeps PP-OCR det within 1e-4 of it.

    Inner loops index flat arrays with unsigned integers: numba then skips its negative-index
    wraparound (a select per element that keeps LLVM from vectorizing), and no array views are
    made in the loops (each costs reference counting). The activation `act` runs on each finished
    output row while it is in L1, or on each finished plane when planes are small."""
    u = np.uint64
    sh, sw, dh, dw, pt, pl, per_group = dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6]
    channels_in, height, width = x.shape[1], x.shape[2], x.shape[3]
    channels_out, group_in, kh, kw = w.shape[0], w.shape[1], w.shape[2], w.shape[3]
    oh, ow = y.shape[2], y.shape[3]
    slots = pad.shape[3]
    xs, ys, ps, ws = x.ravel(), y.ravel(), pad.ravel(), w.ravel()
    tap_offsets = np.empty(kw, np.uint64)  # column tap j: its phase row's start, from the row's start
    for j in range(kw):
        tap_offsets[j] = u(((j * dw) % sw) * height * slots + (j * dw) // sw)
    channel_size = u(sw * height * slots)
    row_width = u(ow)
    act_plane = act != IDENTITY and oh * ow <= SMALL_PLANE
    act_rows = act != IDENTITY and not act_plane
    copied = -1
    for p in range(first, last):
        image = p // channels_out
        m = p % channels_out
        group = image * (channels_out // per_group) + m // per_group
        if group != copied:  # output channels of one group share the copy
            copied = group
            for ci in range(group_in):
                plane = image * channels_in + (m // per_group) * group_in + ci
                for phase in range(sw):
                    column = (phase - pl) % sw  # first input column landing in this phase
                    slot = (column + pl) // sw
                    count = min((width - column + sw - 1) // sw, slots - slot)
                    if count <= 0:
                        continue
                    step = u(sw)
                    for r in range(height):
                        source = u((plane * height + r) * width + column)
                        target = u(((ci * sw + phase) * height + r) * slots + slot)
                        for q in range(u(count)):
                            ps[target + q] = xs[source + q * step]
        shift = bias[m]
        for r in range(oh):
            out = u((p * oh + r) * ow)
            for q in range(row_width):
                ys[out + q] = 0.0
            top = r * sh - pt
            for ci in range(group_in):
                taps = (m * group_in + ci) * kh * kw
                base = u(ci) * channel_size
                if kh == 3 and kw == 3 and top >= 0 and top + 2 * dh < height:
                    w0, w1, w2 = ws[taps], ws[taps + 1], ws[taps + 2]
                    w3, w4, w5 = ws[taps + 3], ws[taps + 4], ws[taps + 5]
                    w6, w7, w8 = ws[taps + 6], ws[taps + 7], ws[taps + 8]
                    a = base + u(top * slots)
                    b = base + u((top + dh) * slots)
                    c = base + u((top + 2 * dh) * slots)
                    a0, a1, a2 = a + tap_offsets[0], a + tap_offsets[1], a + tap_offsets[2]
                    b0, b1, b2 = b + tap_offsets[0], b + tap_offsets[1], b + tap_offsets[2]
                    c0, c1, c2 = c + tap_offsets[0], c + tap_offsets[1], c + tap_offsets[2]
                    for q in range(row_width):
                        ys[out + q] += (w0 * ps[a0 + q] + w1 * ps[a1 + q] + w2 * ps[a2 + q]
                                        + w3 * ps[b0 + q] + w4 * ps[b1 + q] + w5 * ps[b2 + q]
                                        + w6 * ps[c0 + q] + w7 * ps[c1 + q] + w8 * ps[c2 + q])
                    continue
                for i in range(kh):
                    ir = top + i * dh
                    if ir < 0 or ir >= height:
                        continue
                    row = base + u(ir * slots)
                    k = taps + i * kw
                    if kw == 3:
                        w0, w1, w2 = ws[k], ws[k + 1], ws[k + 2]
                        a0, a1, a2 = row + tap_offsets[0], row + tap_offsets[1], row + tap_offsets[2]
                        for q in range(row_width):
                            ys[out + q] += w0 * ps[a0 + q] + w1 * ps[a1 + q] + w2 * ps[a2 + q]
                    elif kw == 5:
                        w0, w1, w2, w3, w4 = ws[k], ws[k + 1], ws[k + 2], ws[k + 3], ws[k + 4]
                        a0, a1, a2 = row + tap_offsets[0], row + tap_offsets[1], row + tap_offsets[2]
                        a3, a4 = row + tap_offsets[3], row + tap_offsets[4]
                        for q in range(row_width):
                            ys[out + q] += (w0 * ps[a0 + q] + w1 * ps[a1 + q] + w2 * ps[a2 + q]
                                            + w3 * ps[a3 + q] + w4 * ps[a4 + q])
                    else:
                        for j in range(kw):
                            tap = ws[k + j]
                            a0 = row + tap_offsets[j]
                            for q in range(row_width):
                                ys[out + q] += tap * ps[a0 + q]
            for q in range(row_width):  # the bias after the taps, as onnxruntime adds it
                ys[out + q] += shift
            if act_rows:  # while the row is in L1
                _activate_row_compiled(ys, out, row_width, act, params)
        if act_plane:  # small planes: one call for the plane (still in L1)
            _activate_row_compiled(ys, u(p * oh * ow), u(oh * ow), act, params)


def _compiled(kernel):
    """`kernel.get()`, once the row activation the kernels call is compiled and bound to the global
    they name (numba resolves a kernel's globals when it compiles it); None when compiled kernels
    are off."""
    global _activate_row_compiled
    row = _activate_row.get()
    if row is None:
        return None
    _activate_row_compiled = row
    return kernel.get()


def handles(x: np.ndarray, w: np.ndarray, bias) -> bool:
    """Dtypes and layouts the compiled kernels take (others keep the NumPy paths)."""
    return (x.dtype in FLOATS and w.dtype == x.dtype and x.flags.c_contiguous
            and (bias is None or (bias.dtype == x.dtype and bias.ndim == 1 and bias.flags.c_contiguous)))


def _cached(memo: dict, name: str, source, make):
    """`make()`, kept in the memo while the same `source` array (a weight) comes back."""
    cached = memo.get(name)
    if cached is None or cached[0] is not source:
        cached = memo[name] = (source, make())
    return cached[1]


_NO_BIAS = {dtype: np.empty(0, dtype) for dtype in FLOATS}
_IDENTITY_PARAMS = {dtype: np.array([0, 0, 0, 1, 1, 0], dtype) for dtype in FLOATS}


def _activation(epilogue, dtype) -> tuple[int, np.ndarray]:
    """(code, params) for the compiled kernels: the FusedActivation's, or none."""
    if isinstance(epilogue, FusedActivation):
        return epilogue.code, epilogue.param_array(dtype)
    return IDENTITY, _IDENTITY_PARAMS[dtype]


def bias_and_epilogue(y2: np.ndarray, bias, epilogue, first: int, last: int, start: int = 0,
                      stop: int | None = None) -> bool:
    """y2[first:last, start:stop] of C-contiguous (N*M, P) output, in place: + bias (a (M,) array
    or None), then the epilogue: one compiled pass for the bias and a FusedActivation, any other
    epilogue called on the block after it. False (nothing done) when compiled kernels are off or
    do not take these arrays."""
    kernel = _compiled(_bias_activation)
    if kernel is None or y2.dtype not in FLOATS or not y2.flags.c_contiguous or (
            bias is not None and bias.dtype != y2.dtype):
        return False
    stop = y2.shape[1] if stop is None else stop
    code, params = _activation(epilogue, y2.dtype)
    if bias is not None or code != IDENTITY:
        bias = _NO_BIAS[y2.dtype] if bias is None else np.ascontiguousarray(bias).reshape(-1)
        kernel(y2, bias, code, params, first, last, start, stop)
    if epilogue is not None and code == IDENTITY:
        epilogue(y2[first:last, start:stop])
    return True



@jit
def _direct_wide(x, w, bias, y, dims, pad, wide, act, params, first, last):
    """_direct for stride 1 and planes of moderate size, without the per-row loop overheads: the
    whole output plane is one "wide" loop. pad (CG, HP*S + slack) holds each input plane padded
    on every side, rows of S = OW + (KW-1)*DW, HP = OH + (KH-1)*DH; output position (r, q) of the
    wide scratch (OH*S) is wide[r*S + q] and kernel tap (i, j) reads pad at that index plus
    i*DH*S + j*DW, so a tap is one contiguous run for the whole plane; the S - OW extra positions
    of each row are dropped when the plane is copied out. pad is zero where no input lands."""
    u = np.uint64
    dh, dw, pt, pl, per_group = dims[2], dims[3], dims[4], dims[5], dims[6]
    channels_in, height, width = x.shape[1], x.shape[2], x.shape[3]
    channels_out, group_in, kh, kw = w.shape[0], w.shape[1], w.shape[2], w.shape[3]
    oh, ow = y.shape[2], y.shape[3]
    slots = ow + (kw - 1) * dw
    rows = oh + (kh - 1) * dh
    plane_size = u(pad.shape[1])
    xs, ys, ps, ws = x.ravel(), y.ravel(), pad.ravel(), w.ravel()
    length = u(oh * slots)
    count = u(max(0, min(width, slots - pl)))
    copied = -1
    for p in range(first, last):
        image = p // channels_out
        m = p % channels_out
        group = image * (channels_out // per_group) + m // per_group
        if group != copied:
            copied = group
            for ci in range(group_in):
                plane = image * channels_in + (m // per_group) * group_in + ci
                for r in range(min(height, rows - pt)):
                    source = u((plane * height + r) * width)
                    target = u(ci) * plane_size + u((r + pt) * slots + pl)
                    for q in range(count):
                        ps[target + q] = xs[source + q]
        start = bias[m]
        for q in range(length):
            wide[q] = start
        for ci in range(group_in):
            taps = (m * group_in + ci) * kh * kw
            base = u(ci) * plane_size
            if kh == 3 and kw == 3:
                w0, w1, w2 = ws[taps], ws[taps + 1], ws[taps + 2]
                w3, w4, w5 = ws[taps + 3], ws[taps + 4], ws[taps + 5]
                w6, w7, w8 = ws[taps + 6], ws[taps + 7], ws[taps + 8]
                a0, a1, a2 = base, base + u(dw), base + u(2 * dw)
                b0, b1, b2 = a0 + u(dh * slots), a1 + u(dh * slots), a2 + u(dh * slots)
                c0, c1, c2 = b0 + u(dh * slots), b1 + u(dh * slots), b2 + u(dh * slots)
                for q in range(length):
                    wide[q] += (w0 * ps[a0 + q] + w1 * ps[a1 + q] + w2 * ps[a2 + q]
                                + w3 * ps[b0 + q] + w4 * ps[b1 + q] + w5 * ps[b2 + q]
                                + w6 * ps[c0 + q] + w7 * ps[c1 + q] + w8 * ps[c2 + q])
                continue
            for i in range(kh):
                row = base + u(i * dh * slots)
                k = taps + i * kw
                if kw == 5:
                    w0, w1, w2, w3, w4 = ws[k], ws[k + 1], ws[k + 2], ws[k + 3], ws[k + 4]
                    a0, a1, a2, a3, a4 = row, row + u(dw), row + u(2 * dw), row + u(3 * dw), row + u(4 * dw)
                    for q in range(length):
                        wide[q] += (w0 * ps[a0 + q] + w1 * ps[a1 + q] + w2 * ps[a2 + q]
                                    + w3 * ps[a3 + q] + w4 * ps[a4 + q])
                else:
                    for j in range(kw):
                        tap = ws[k + j]
                        a0 = row + u(j * dw)
                        for q in range(length):
                            wide[q] += tap * ps[a0 + q]
        out = u(p * oh * ow)
        for r in range(oh):
            source = u(r * slots)
            target = out + u(r * ow)
            for q in range(u(ow)):
                ys[target + q] = wide[source + q]
        if act != IDENTITY:
            _activate_row_compiled(ys, out, u(oh * ow), act, params)

DIRECT_MAX_GROUP_IN = 4  # grouped convolutions with up to this many input channels per group go direct


def direct_fits(x_shape, w_shape, group: int) -> bool:
    """Shapes the direct kernel serves: 2-D and grouped, with one input channel per group
    (depthwise, any channel multiplier) or a few. (Dense convolutions with few input channels,
    the stems over RGB, measured faster or even as compiled im2col + GEMM, see small_dense.)"""
    return len(x_shape) == 4 and len(w_shape) == 4 and group > 1 and w_shape[1] <= DIRECT_MAX_GROUP_IN and \
        x_shape[1] == w_shape[1] * group and w_shape[0] % group == 0


WIDE_MAX_POSITIONS = 1 << 15  # stride-1 direct convolutions with wide planes up to this size run _direct_wide


class _DirectPlan:
    """What depends on the shapes only: which kernel, its dims, the jobs, and per thread its scratch."""

    def __init__(self, x_shape, w_shape, geo, group: int, dtype):
        n, _, h = x_shape[:3]
        m, group_in, kh, kw = w_shape
        (oh, ow), (dh, dw) = geo.out, geo.dilations
        self.out_shape = (n, m, oh, ow)
        self.dims = np.array(tuple(geo.strides) + tuple(geo.dilations) + tuple(geo.pads_begin) + (m // group,), np.int64)
        sw = geo.strides[1]
        slots = ow + (kw - 1) * dw
        # the wide loop also runs the kernel rows that fall in the padding, which the row loop
        # skips: fine once the plane is taller than the kernel (measured faster from there on,
        # up to planes whose wide scratch leaves L2)
        self.is_wide = tuple(geo.strides) == (1, 1) and oh > (kh - 1) * dh and oh * slots <= WIDE_MAX_POSITIONS
        if self.is_wide:
            self.pad_shape = (group_in, (oh + (kh - 1) * dh) * slots + (kw - 1) * dw)
            self.wide_size = oh * slots
        else:
            self.pad_shape = (group_in, sw, h, ow + (kw - 1) * dw // sw)
            self.wide_size = 0
        self.dtype = dtype
        self.planes = n * m
        # a job's output stays in L2 for its epilogue; a job copies its groups' input planes once,
        # which costs (group_in / per_group) of an output plane each, so dense groups take more planes
        plane_bytes = oh * ow * dtype.itemsize
        per_job = max(1, BLOCK_BYTES // max(plane_bytes, 1), min(m // group, 2 * group_in))
        num_jobs = -(-self.planes // per_job)
        per_job = -(-self.planes // num_jobs)  # even jobs
        self.jobs = [(start, min(self.planes, start + per_job)) for start in range(0, self.planes, per_job)]
        self._scratch: dict = {}

    def run(self, kernels, x, w, bias, y, code, params, first, last) -> None:
        thread = threading.get_ident()
        scratch = self._scratch.get(thread)
        if scratch is None:
            # zeroed once: the kernels rewrite the same interior on every call, the padding stays 0
            scratch = self._scratch[thread] = (np.zeros(self.pad_shape, self.dtype), np.empty(self.wide_size, self.dtype))
        if self.is_wide:
            kernels[1](x, w, bias, y, self.dims, scratch[0], scratch[1], code, params, first, last)
        else:
            kernels[0](x, w, bias, y, self.dims, scratch[0], code, params, first, last)


def direct(x: np.ndarray, w: np.ndarray, bias, geo, group: int, memo: dict, epilogue=None) -> np.ndarray | None:
    """A grouped 2-D convolution that `direct_fits`, compiled; None when not handled here. Output
    planes go in jobs of about BLOCK_BYTES, shared with the helper thread when large; an epilogue
    that is not a FusedActivation runs on each job's block right after it is computed. The memo
    holds the plan per input shape (the step's attributes, so its geometry, are fixed)."""
    kernels = (_compiled(_direct), _compiled(_direct_wide))
    if kernels[0] is None or kernels[1] is None or not handles(x, w, bias):
        return None
    key = ("jit-direct", x.shape, x.dtype, w.shape)
    plan = memo.get(key)
    if plan is None:
        if len(memo) > 32:
            memo.clear()
        fits = direct_fits(x.shape, w.shape, group) and x.size > 0 and min(geo.out) > 0
        plan = memo[key] = _DirectPlan(x.shape, w.shape, geo, group, x.dtype) if fits else False
    if plan is False:
        return None
    if not w.flags.c_contiguous:
        w = _cached(memo, "jit-direct-w", w, lambda: np.ascontiguousarray(w))
    shift = bias if bias is not None else _cached(memo, "jit-direct-zeros", w, lambda: np.zeros(w.shape[0], x.dtype))
    code, params = _activation(epilogue, x.dtype)
    y = np.empty(plan.out_shape, x.dtype)
    jobs = plan.jobs
    if len(jobs) == 1:
        plan.run(kernels, x, w, shift, y, code, params, 0, plan.planes)
        if epilogue is not None and code == IDENTITY:
            epilogue(y)
        return y

    def run(job):
        first, last = jobs[job]
        plan.run(kernels, x, w, shift, y, code, params, first, last)
        if epilogue is not None and code == IDENTITY:
            epilogue(y.reshape(plan.planes, -1)[first:last])

    if x.nbytes + y.nbytes < PARALLEL_BYTES:
        for job in range(len(jobs)):
            run(job)
    else:
        parallel_for(len(jobs), run, x.nbytes + y.nbytes)
    return y


@jit
def _wide_columns(x, planes, cols, dims, kh, kw):
    """Columns of a dense convolution in the phase layout (see im2col.py), from x in one call.

    planes (SH*SW, N*C, HQ*WQ + slack): phase (a, b) holds the padded input's rows a, a + SH, ...
    and columns b, b + SW, ...; zero in the padding (every call writes the same interior).
    cols (C*KH*KW, N*L), L = OH*WQ "wide" output positions per image: kernel tap (i, j) of channel c
    for image n is one contiguous run of its phase plane, at row offset (i*DH)//SH and column offset
    (j*DW)//SW; the WQ - OW extra positions of each row are computed and dropped by _crop.
    dims = (stride h, w, dilation h, w, pad top, pad left, HQ, WQ, OH)."""
    u = np.uint64
    sh, sw, dh, dw, pt, pl = dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]
    hq, wq, oh = dims[6], dims[7], dims[8]
    n, channels, height, width = x.shape[0], x.shape[1], x.shape[2], x.shape[3]
    stride = u(planes.shape[2])
    xs, ps, cs = x.ravel(), planes.ravel(), cols.ravel()
    images = u(n * channels)
    for ph in range(sh):
        row0 = (ph - pt) % sh  # first input row landing in phase row ph
        a0 = (row0 + pt) // sh
        rows = min((height - row0 + sh - 1) // sh, hq - a0)
        for pw in range(sw):
            column0 = (pw - pl) % sw
            b0 = (column0 + pl) // sw
            count = u(max(0, min((width - column0 + sw - 1) // sw, wq - b0)))
            step = u(sw)
            base = u(ph * sw + pw) * images * stride
            for plane in range(n * channels):
                for a in range(max(rows, 0)):
                    target = base + u(plane) * stride + u((a0 + a) * wq + b0)
                    source = u((plane * height + row0 + a * sh) * width + column0)
                    for q in range(count):
                        ps[target + q] = xs[source + q * step]
    length = u(oh * wq)
    total = u(n) * length
    for c in range(channels):
        for i in range(kh):
            for j in range(kw):
                phase = u(((i * dh) % sh) * sw + (j * dw) % sw)
                offset = u(((i * dh) // sh) * wq + (j * dw) // sw)
                row = u((c * kh + i) * kw + j) * total
                for image in range(n):
                    source = (phase * images + u(image * channels + c)) * stride + offset
                    target = row + u(image) * length
                    for q in range(length):
                        cs[target + q] = ps[source + q]


@jit
def _crop(wide, y, bias, act, params, wq):
    """y (N, M, OH, OW) from the wide GEMM result (M, N*OH*WQ): + bias[m] (zeros when the node
    has none), then the activation, dropping the WQ - OW extra positions of each row."""
    u = np.uint64
    n, m, oh, ow = y.shape[0], y.shape[1], y.shape[2], y.shape[3]
    ws, ys = wide.ravel(), y.ravel()
    width = u(ow)
    for image in range(n):
        for channel in range(m):
            shift = bias[channel]
            for r in range(oh):
                source = u(channel * n * oh * wq + (image * oh + r) * wq)
                target = u(((image * m + channel) * oh + r) * ow)
                for q in range(width):
                    ys[target + q] = ws[source + q] + shift
            if act != IDENTITY:  # the plane, still in cache: one call (its rows are short)
                _activate_row_compiled(ys, u((image * m + channel) * oh * ow), u(oh * ow), act, params)


SMALL_DENSE_BYTES = 1 << 21  # dense convolutions whose wide columns fit here take the compiled path


class _DensePlan:
    """Shapes of the phase planes, columns and wide result of one dense convolution."""

    def __init__(self, x_shape, w_shape, geo, dtype):
        n, c, h, w = x_shape
        m, _, kh, kw = w_shape
        (sh, sw), (dh, dw), (pt, pl), (pb, pr), (oh, ow) = geo.strides, geo.dilations, geo.pads_begin, geo.pads_end, geo.out
        hq = max(-(-(h + pt + pb) // sh), oh + (kh - 1) * dh // sh)
        wq = max(-(-(w + pl + pr) // sw), ow + (kw - 1) * dw // sw)
        slack = ((kh - 1) * dh // sh) * wq + (kw - 1) * dw // sw + 1
        self.kernel = (kh, kw)
        self.dims = np.array([sh, sw, dh, dw, pt, pl, hq, wq, oh], np.int64)
        self.wq = wq
        self.planes_shape = (sh * sw, n * c, hq * wq + slack)
        self.cols_shape = (c * kh * kw, n * oh * wq)
        self.wide_shape = (m, n * oh * wq)
        self.out_shape = (n, m, oh, ow)
        self.dtype = dtype
        self.nbytes = (math.prod(self.planes_shape) + math.prod(self.cols_shape) + math.prod(self.wide_shape)) * dtype.itemsize
        self._scratch: dict = {}

    def scratch(self):
        """(planes, columns, wide result) of the calling thread."""
        thread = threading.get_ident()
        buffers = self._scratch.get(thread)
        if buffers is None:  # the planes zeroed once: _wide_columns rewrites the same interior
            buffers = self._scratch[thread] = (np.zeros(self.planes_shape, self.dtype),
                                               np.empty(self.cols_shape, self.dtype), np.empty(self.wide_shape, self.dtype))
        return buffers


def small_dense(x: np.ndarray, w: np.ndarray, bias, geo, memo: dict, epilogue=None) -> np.ndarray | None:
    """Dense (group 1) 2-D convolution with small columns: compiled phase-layout columns, one GEMM
    for all images, and one compiled pass for crop + bias + activation; None when not handled
    here (compiled kernels off, other dtypes, or columns over SMALL_DENSE_BYTES)."""
    if not handles(x, w, bias) or len(geo.out) != 2 or x.size == 0 or min(geo.out) <= 0:
        return None
    columns, crop = _compiled(_wide_columns), _compiled(_crop)
    if columns is None or crop is None:
        return None
    key = ("jit-dense", x.shape, x.dtype, w.shape, geo)
    plan = memo.get(key)
    if plan is None:
        if len(memo) > 32:
            memo.clear()
        plan = memo[key] = _DensePlan(x.shape, w.shape, geo, x.dtype)
    if plan.nbytes > SMALL_DENSE_BYTES:
        return None
    m = w.shape[0]
    weights = _cached(memo, "jit-dense-w", w, lambda: np.ascontiguousarray(w).reshape(m, -1))
    planes, cols, wide = plan.scratch()
    columns(x, planes, cols, plan.dims, *plan.kernel)
    np.matmul(weights, cols, out=wide)
    code, params = _activation(epilogue, x.dtype)
    y = np.empty(plan.out_shape, x.dtype)
    shift = bias if bias is not None else _cached(memo, "jit-dense-zeros", w, lambda: np.zeros(m, x.dtype))
    crop(wide, y, shift, code, params, plan.wq)
    if epilogue is not None and code == IDENTITY:
        epilogue(y)
    return y


@jit
def _interleave_patches(cols, y, bias, kh, kw, first, last):
    """y (N, M, H*KH, W*KW) from per-tap planes cols (N*M, KH*KW, H*W): y[n, m, r*KH + i,
    q*KW + j] = cols[n*M + m, i*KW + j, r*W + q] + bias[m] (zeros when the node has none), for planes
    n*M + m in [first, last). Output rows are written in order, each from the KW tap planes of its
    kernel row."""
    u = np.uint64
    m, out_h, out_w = y.shape[1], y.shape[2], y.shape[3]
    h, w = out_h // kh, out_w // kw
    cs, ys = cols.ravel(), y.ravel()
    plane = u(h * w)
    width = u(w)
    for p in range(first, last):
        shift = bias[p % m]
        for r in range(h):
            for i in range(kh):
                target = u((p * out_h + r * kh + i) * out_w)
                source = u(p * kh * kw + i * kw) * plane + u(r * w)
                if kw == 2:
                    second = source + plane
                    for q in range(width):
                        ys[target + u(2) * q] = cs[source + q] + shift
                        ys[target + u(2) * q + u(1)] = cs[second + q] + shift
                else:
                    for j in range(kw):
                        tap = source + u(j) * plane
                        for q in range(width):
                            ys[target + q * u(kw) + u(j)] = cs[tap + q] + shift


def interleave_patches(cols: np.ndarray, bias, out_shape, kernel) -> np.ndarray | None:
    """ConvTranspose's patches (stride == kernel, conv._unpatchify) as its output, compiled: cols
    (N, M * KH * KW, H * W) in one pass with the bias; None when not handled here (compiled
    kernels off, not 2-D, other dtypes)."""
    kernel_fn = _compiled(_interleave_patches)
    if kernel_fn is None or len(kernel) != 2 or cols.dtype not in FLOATS or not cols.flags.c_contiguous or (
            bias is not None and (bias.dtype != cols.dtype or bias.ndim != 1)):
        return None
    y = np.empty(out_shape, cols.dtype)
    bias = np.zeros(out_shape[1], cols.dtype) if bias is None else np.ascontiguousarray(bias)
    planes = out_shape[0] * out_shape[1]
    per_job = max(1, (BLOCK_BYTES * 8) // max(math.prod(out_shape[2:]) * cols.itemsize, 1))
    jobs = [(start, min(planes, start + per_job)) for start in range(0, planes, per_job)]
    parallel_for(len(jobs), lambda job: kernel_fn(cols, y, bias, *kernel, *jobs[job]), cols.nbytes + y.nbytes)
    return y

