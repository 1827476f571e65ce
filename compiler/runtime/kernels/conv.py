"""Convolutions: Conv / com.microsoft FusedConv and ConvTranspose (GEMM + col2im).

`conv_plan` picks a path per input shape: pointwise (a GEMM on the input as it lies), depthwise
(band GEMMs, depthwise.py), narrowing stride-1 2-D (one GEMM per tap, conv_taps.py), other dense
2-D (phase-layout im2col, im2col.py), and the generic im2col + one BLAS GEMM per group for the
rest. Bias, residual and activation are fused into the epilogue.

With compiled kernels on (runtime/jit.py), jit_conv.py takes over where NumPy's per-call costs
dominate: depthwise and few-channel grouped convolutions run direct, small dense ones as one
compiled im2col + one GEMM, and bias + a known activation (jit_conv.FusedActivation) take one
compiled pass over each output block; every other case keeps the NumPy path."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ...fused_activations import SELU_ALPHA, SELU_GAMMA
from ..gemm_impls import OPENBLAS_SERIAL_MACS, blas_threads, product_into
from . import im2col as phased
from . import amx_conv, amx_taps, jit_conv
from .common import arg, clip_into, parallel_for
from .conv_taps import dense2d_taps, prefers_taps
from .depthwise import depthwise_conv, is_depthwise


@dataclass(frozen=True)
class Geometry:
    strides: tuple
    dilations: tuple
    pads_begin: tuple
    pads_end: tuple
    out: tuple


def geometry(spatial, kernel, attrs, ceil_mode: bool = False) -> Geometry:
    nd = len(spatial)
    strides = tuple(attrs.get("strides") or [1] * nd)
    dilations = tuple(attrs.get("dilations") or [1] * nd)
    pads = list(attrs.get("pads") or [0] * (2 * nd))
    begin, end = pads[:nd], pads[nd:]
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        for i in range(nd):
            out = -(-spatial[i] // strides[i])
            total = max((out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - spatial[i], 0)
            small = total // 2
            begin[i], end[i] = (small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small)
    elif auto_pad == "VALID":
        begin, end = [0] * nd, [0] * nd
    out = []
    for i in range(nd):
        span = (kernel[i] - 1) * dilations[i] + 1
        room = spatial[i] + begin[i] + end[i] - span
        count = (-(-room // strides[i]) if ceil_mode else room // strides[i]) + 1
        if ceil_mode and (count - 1) * strides[i] >= spatial[i] + begin[i]:
            count -= 1  # the last window must start inside the input or its leading pad
        out.append(count)
    return Geometry(strides, dilations, tuple(begin), tuple(end), tuple(out))


def padded(x: np.ndarray, begin, end, value=0.0) -> np.ndarray:
    if not any(begin) and not any(end):
        return x
    shape = x.shape[:2] + tuple(d + b + e for d, b, e in zip(x.shape[2:], begin, end))
    xp = np.full(shape, value, dtype=x.dtype)
    xp[(slice(None), slice(None)) + tuple(slice(b, b + d) for b, d in zip(begin, x.shape[2:]))] = x
    return xp


def taps(kernel, geo: Geometry):
    """For each kernel offset: its index and the strided slice of the padded input it reads."""
    for index in itertools.product(*(range(k) for k in kernel)):
        yield index, (slice(None), slice(None)) + tuple(
            slice(k * d, k * d + (o - 1) * s + 1, s) for k, d, o, s in zip(index, geo.dilations, geo.out, geo.strides))


def im2col(xp: np.ndarray, kernel, geo: Geometry) -> np.ndarray:
    """(N, C, *spatial) -> (N, C * prod(kernel), prod(out)), rows ordered (c, k1, k2, ...)."""
    nd = len(kernel)
    n, c = xp.shape[:2]
    if all(k == 1 for k in kernel) and all(s == 1 for s in geo.strides):
        return xp.reshape(n, c, -1)
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, geo.dilations)]
    windows = sliding_window_view(xp, spans, axis=tuple(range(2, 2 + nd)))
    windows = windows[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in geo.strides)
                      + tuple(slice(None, None, d) for d in geo.dilations)]
    order = (0, 1) + tuple(range(2 + nd, 2 + 2 * nd)) + tuple(range(2, 2 + nd))
    return np.ascontiguousarray(windows.transpose(order)).reshape(n, c * math.prod(kernel), -1)


# 1-D im2col by one gather up to this many bytes of columns: sliding_window_view costs tens of
# microseconds of Python a call, most of a small convolution's time (a VAD's [1, 129, 4] frames);
# past it the strided copy is faster
TAKE_COLUMNS_BYTES = 1 << 20


def columns_1d(xp: np.ndarray, kernel: int, geo: Geometry, memo: dict) -> np.ndarray:
    """im2col of a 1-D convolution, (N, C, L) -> (N, C * kernel, out): the window starts of each
    tap gathered at once (the index table is memoized per geometry)."""
    key = ("conv1d-taps", kernel, geo)
    index = memo.get(key)
    if index is None:
        index = memo[key] = (np.arange(kernel)[:, None] * geo.dilations[0] + np.arange(geo.out[0]) * geo.strides[0])
    n, c = xp.shape[:2]
    return np.take(xp, index, axis=2).reshape(n, c * kernel, geo.out[0])


def depthwise(xp: np.ndarray, w: np.ndarray, geo: Geometry) -> np.ndarray:
    """One channel per group: accumulate one strided slice per kernel tap (no loop over channels)."""
    c = xp.shape[1]
    m = w.shape[0]
    if m != c:  # channel multiplier: output channel j reads input channel j // (m // c)
        xp = np.repeat(xp, m // c, axis=1)
    bcast = (1, m) + (1,) * (xp.ndim - 2)
    acc = tmp = None
    for index, window in taps(w.shape[2:], geo):
        tap = w[(slice(None), 0) + index].reshape(bcast)
        if acc is None:
            acc = np.multiply(xp[window], tap)
            tmp = np.empty_like(acc)
        else:
            acc += np.multiply(xp[window], tap, out=tmp)
    return acc


POINTWISE, DEPTHWISE, PHASED_DENSE, GENERIC, SMALL_DENSE, TAPS_DENSE = range(6)


@dataclass(frozen=True)
class ConvPlan:
    """What depends on the shapes only, decided once per input shape (kept in the step's memo)."""
    kind: int
    geo: Geometry
    kernel: tuple
    group: int
    out_shape: tuple
    is_direct: bool = False  # the compiled direct kernel serves it (jit_conv.direct_fits), when compiled kernels are on
    pins_blas: bool = True  # some GEMM is large enough for OpenBLAS to thread it (see conv_forward)


def conv_plan(x_shape, x_dtype, w_shape, attrs, memo: dict | None) -> ConvPlan:
    key = ("conv-plan", x_shape, x_dtype, w_shape)
    plan = memo.get(key) if memo is not None else None
    if plan is not None:
        return plan
    c, m, group = x_shape[1], w_shape[0], attrs.get("group", 1)
    kernel = tuple(attrs.get("kernel_shape") or w_shape[2:])
    geo = geometry(x_shape[2:], kernel, attrs)
    pointwise = all(k == 1 for k in kernel) and all(s == 1 for s in geo.strides) and not any(geo.pads_begin + geo.pads_end)
    is_empty = math.prod(x_shape) == 0 or any(o <= 0 for o in geo.out)
    if pointwise and group == 1:
        kind = POINTWISE
    elif is_empty:
        kind = GENERIC
    elif x_dtype.kind == "f" and is_depthwise(x_shape, w_shape, group):
        kind = DEPTHWISE
    elif len(kernel) == 2 and x_dtype.kind == "f" and group == 1 and any(s > 1 for s in geo.strides) and \
            phased.small_enough(x_shape, kernel, geo, x_dtype.itemsize):
        kind = SMALL_DENSE  # strided and small: one windows copy beats the per-phase copies
    elif len(kernel) == 2 and all(d == 1 for d in geo.dilations) and x_dtype.kind == "f" and group == 1:
        strided = any(s > 1 for s in geo.strides)
        kind = TAPS_DENSE if not strided and prefers_taps(c, m, math.prod(kernel)) else PHASED_DENSE
    else:
        kind = GENERIC
    is_direct = kind != POINTWISE and not is_empty and jit_conv.direct_fits(x_shape, w_shape, group)
    # the largest GEMM a path issues: one image's, or all images' (pointwise over one pixel, the
    # compiled small dense path); x2 as the latter multiplies wide rows, a little longer than the output's
    per_image = m * (c // max(group, 1)) * math.prod(kernel) * math.prod(geo.out)
    images = 1 if kind == POINTWISE and math.prod(x_shape[2:]) > 1 else x_shape[0]
    pins_blas = 2 * per_image * images >= OPENBLAS_SERIAL_MACS
    plan = ConvPlan(kind, geo, kernel, group, (x_shape[0], m) + geo.out, is_direct, pins_blas)
    if memo is not None:
        if len(memo) > 64:
            memo.clear()
        memo[key] = plan
    return plan


def conv_forward(x: np.ndarray, w: np.ndarray, bias, attrs, residual=None, memo: dict | None = None,
                 epilogue=None, tiles: bool = False) -> np.ndarray:
    """`epilogue(block)`: an in-place elementwise function (an activation) the fast paths apply to
    each block of output right after computing it, while it is in cache; the others after the
    whole output (and after the residual). `tiles`: x and w hold bf16 values and a dense
    convolution runs on AMX-BF16 tiles where they are usable (amx_conv.py)."""
    plan = conv_plan(x.shape, x.dtype, w.shape, attrs, memo)
    memo = {} if memo is None else memo
    if tiles and plan.kind != DEPTHWISE and amx_conv.applies(x.shape, w.shape, plan.group):
        geo = plan.geo
        y = amx_taps.tap_conv(x, w, geo.strides, geo.dilations, geo.pads_begin, geo.pads_end, geo.out, memo) \
            if amx_taps.applies(x.shape[1], w.shape[2:]) else None
        if y is None:
            y = amx_conv.tiled_conv(amx_conv.padded_input(x, plan.geo.pads_begin, plan.geo.pads_end), w,
                                    plan.geo.strides, plan.geo.dilations, plan.geo.out, memo)
        if y is not None:
            return _with_bias(y, bias, residual, epilogue)
    if plan.is_direct:  # no BLAS call: skip pinning its threads (microseconds on small convolutions)
        y = jit_conv.direct(x, w, bias, plan.geo, plan.group, memo, epilogue if residual is None else None)
        if y is not None:
            return _finish(y, residual, epilogue)
    if not plan.pins_blas:  # OpenBLAS runs such GEMMs on this thread anyway: skip pinning (microseconds)
        return _conv_forward(plan, x, w, bias, residual, memo, epilogue)
    with blas_threads(1):  # large GEMM blocks are shared with the helper thread (parallel_for) instead
        return _conv_forward(plan, x, w, bias, residual, memo, epilogue)


def _with_bias(y: np.ndarray, bias, residual, epilogue) -> np.ndarray:
    """Bias, residual and epilogue on an output computed without them (one compiled pass for bias
    and epilogue where there is no residual)."""
    n, m = y.shape[:2]
    if residual is not None and residual.shape == y.shape:
        y += residual  # (conv + z) + b: the sum of the same three terms as the float32 path's, in another order
        residual = None
    if residual is None and jit_conv.bias_and_epilogue(y.reshape(n * m, -1), bias, epilogue, 0, n * m):
        return y
    if bias is not None:
        y += bias.reshape((m,) + (1,) * (y.ndim - 2))
    return _finish(y, residual, epilogue) if residual is not None else _then(y, epilogue)


def _then(y: np.ndarray, epilogue) -> np.ndarray:
    if epilogue is not None:
        epilogue(y)
    return y


def _finish(y: np.ndarray, residual, epilogue) -> np.ndarray:
    """The residual, and then the epilogue, on an output computed without them."""
    if residual is not None:
        y += residual
        if epilogue is not None:
            epilogue(y)
    return y


def _conv_forward(plan: ConvPlan, x, w, bias, residual, memo, epilogue) -> np.ndarray:
    late = epilogue if residual is not None else None
    early = epilogue if residual is None else None
    compiled = None
    if plan.kind in (SMALL_DENSE, PHASED_DENSE):
        compiled = jit_conv.small_dense(x, w, bias, plan.geo, memo, early)
    if compiled is not None:
        y = compiled
    elif plan.kind == POINTWISE:
        y = _pointwise(x, w, bias, early)
    elif plan.kind == SMALL_DENSE:
        y = phased.small_conv(x, w, bias, plan.kernel, plan.geo, memo)
        late = epilogue
    elif plan.kind == DEPTHWISE:
        y = depthwise_conv(x, w, bias, plan.geo, memo, early)
    elif plan.kind == TAPS_DENSE:
        geo = plan.geo
        y = dense2d_taps(x, w, bias, geo.pads_begin, geo.pads_end, geo.out, memo, early)
    elif plan.kind == PHASED_DENSE:
        geo = plan.geo
        y = phased.dense2d(x, w, bias, geo.strides, geo.pads_begin, geo.pads_end, geo.out, memo, early)
    else:
        y = _generic(x, w, bias, plan, memo)
        late = epilogue
    if residual is not None:
        y += residual
    if late is not None:
        late(y)
    return y


POINTWISE_BLOCK_BYTES = 1 << 20  # pointwise output block: GEMM, bias and activation while it is in cache


def _pointwise(x: np.ndarray, w: np.ndarray, bias, epilogue=None) -> np.ndarray:
    """1x1, stride 1, no pads, one group: a GEMM per image, in column blocks when the output is
    large (so bias and activation run in cache); with one pixel per image (squeeze-and-excitation
    blocks) one GEMM over all images. Bias and epilogue take one compiled pass where they can
    (jit_conv.bias_and_epilogue)."""
    n, c = x.shape[:2]
    m = w.shape[0]
    pixels = x.size // (n * c) if n * c else 0
    weights = w.reshape(m, c)
    if pixels == 1:
        y = np.matmul(x.reshape(n, c), weights.T)
        if not jit_conv.bias_and_epilogue(y.reshape(n * m, 1), bias, epilogue, 0, n * m):
            if bias is not None:
                y += bias
            if epilogue is not None:
                epilogue(y)
        return y.reshape((n, m) + x.shape[2:])
    column = bias.reshape(m, 1) if bias is not None else None
    width = max(256, POINTWISE_BLOCK_BYTES // max(m * x.itemsize, 1))
    if width >= pixels:
        y = np.matmul(weights, x.reshape(n, c, pixels)) if n > 1 else product_into(weights, x.reshape(c, pixels))
        if not jit_conv.bias_and_epilogue(y.reshape(n * m, pixels), bias, epilogue, 0, n * m):
            if column is not None:
                y += column
            if epilogue is not None:
                epilogue(y)
        return y.reshape((n, m) + x.shape[2:])
    y = np.empty((n, m, pixels), dtype=np.result_type(x.dtype, w.dtype))
    x3 = x.reshape(n, c, pixels)
    rows = y.reshape(n * m, pixels)
    items = [(image, start) for image in range(n) for start in range(0, pixels, width)]

    def run(index):
        image, start = items[index]
        block = y[image, :, start:start + width]
        np.matmul(weights, x3[image, :, start:start + width], out=block)
        if jit_conv.bias_and_epilogue(rows, bias, epilogue, image * m, (image + 1) * m, start, min(start + width, pixels)):
            return
        if column is not None:
            block += column
        if epilogue is not None:
            epilogue(block)

    parallel_for(len(items), run, x.nbytes + y.nbytes)
    return y.reshape((n, m) + x.shape[2:])


def _generic(x: np.ndarray, w: np.ndarray, bias, plan: ConvPlan, memo: dict | None = None) -> np.ndarray:
    memo = {} if memo is None else memo
    n, c = x.shape[:2]
    m, group, kernel, geo = w.shape[0], plan.group, plan.kernel, plan.geo
    xp = padded(x, geo.pads_begin, geo.pads_end)
    if group == c and w.shape[1] == 1 and group > 1:
        y = depthwise(xp, w, geo)
    else:
        small_1d = len(kernel) == 1 and xp.itemsize * n * c * kernel[0] * geo.out[0] <= TAKE_COLUMNS_BYTES
        cols = columns_1d(xp, kernel[0], geo, memo) if small_1d else im2col(xp, kernel, geo)
        weights = w.reshape(m, -1)
        if group == 1:
            y = np.matmul(weights, cols)
        else:
            y = np.empty((n, m, cols.shape[-1]), dtype=x.dtype)
            rows, outs = cols.shape[1] // group, m // group
            for g in range(group):
                np.matmul(weights[g * outs:(g + 1) * outs], cols[:, g * rows:(g + 1) * rows],
                          out=y[:, g * outs:(g + 1) * outs])
        y = y.reshape((n, m) + geo.out)
    if bias is not None:
        y += bias.reshape((m,) + (1,) * len(geo.out))
    return y


def conv(inputs, attrs, ctx):
    return [conv_forward(inputs[0], inputs[1], arg(inputs, 2), attrs, memo=ctx.memo, tiles=ctx.bf16_tiles)]


def apply_activation(y: np.ndarray, name: str | None, params) -> np.ndarray:
    """ORT's fused activations, in place: activation_params are (alpha) for LeakyRelu, Elu and
    ThresholdedRelu, (min, max) for Clip, (alpha, beta) for HardSigmoid and (alpha, gamma) for Selu."""
    if not name or name == "Identity":
        return y
    if name == "Relu":
        return np.maximum(y, 0, out=y)
    if name == "Tanh":
        return np.tanh(y, out=y)
    if name == "Sigmoid":
        y *= 0.5
        np.tanh(y, out=y)
        y *= 0.5
        y += 0.5
        return y
    if name == "LeakyRelu":
        alpha = params[0] if params else 0.01
        return np.maximum(y, y * alpha, out=y) if 0 <= alpha <= 1 else np.where(y >= 0, y, y * alpha)
    if name == "Clip":
        return clip_into(y, params[0], params[1], y)
    if name == "HardSigmoid":
        alpha, beta = (params or [0.2, 0.5])[:2]
        y *= alpha
        y += beta
        return clip_into(y, 0.0, 1.0, y)
    if name == "Softplus":
        return np.logaddexp(y, 0, out=y)
    if name == "Softsign":
        y /= 1 + np.abs(y)
        return y
    if name == "ThresholdedRelu":
        y[y <= (params[0] if params else 1.0)] = 0
        return y
    if name in ("Elu", "Selu"):
        alpha, gamma = (params[0] if params else SELU_ALPHA if name == "Selu" else 1.0), (
            params[1] if name == "Selu" and len(params) > 1 else SELU_GAMMA if name == "Selu" else 1.0)
        negative = y < 0
        y[negative] = alpha * np.expm1(y[negative])
        if gamma != 1.0:
            y *= gamma
        return y
    raise NotImplementedError(f"fused activation {name}")



IN_PLACE_ACTIVATIONS = {"Relu", "Tanh", "Sigmoid", "Clip", "HardSigmoid"}


def fused_conv(inputs, attrs, ctx, then=None):
    """`then(block)`: an in-place elementwise function run after the activation (conv_epilogue.py)."""
    name, params = attrs.get("activation"), attrs.get("activation_params")
    in_place = not name or name in IN_PLACE_ACTIVATIONS or (name == "LeakyRelu" and 0 <= (params[0] if params else 0.01) <= 1)
    epilogue = None
    if in_place and name and then is not None:
        def epilogue(block):
            apply_activation(block, name, params)
            then(block)
    elif in_place and name:
        epilogue = _activation_epilogue(name, params, ctx.memo)
    elif in_place:
        epilogue = then
    y = conv_forward(inputs[0], inputs[1], arg(inputs, 2), attrs, residual=arg(inputs, 3), memo=ctx.memo,
                     epilogue=epilogue, tiles=ctx.bf16_tiles)
    if not in_place:
        y = apply_activation(y, name, params)
        if then is not None:
            then(y)
    return [y]


def _activation_epilogue(name: str, params, memo: dict):
    """The fused activation as an epilogue: a jit_conv.FusedActivation (compiled kernels apply it
    in their own pass) for the activations they know, else a NumPy closure; kept in the memo."""
    key = ("activation-epilogue", name, tuple(params or ()))
    epilogue = memo.get(key)
    if epilogue is None:
        def numpy_form(block):
            apply_activation(block, name, params)

        known = jit_conv.activation_code(name, params)
        epilogue = numpy_form if known is None else jit_conv.FusedActivation(known[0], known[1], numpy_form)
        memo[key] = epilogue
    return epilogue


def conv_transpose(inputs, attrs, ctx):
    x, w, bias = inputs[0], inputs[1], arg(inputs, 2)
    n, c = x.shape[:2]
    group = attrs.get("group", 1)
    outs = w.shape[1]
    kernel = tuple(attrs.get("kernel_shape") or w.shape[2:])
    nd = len(kernel)
    spatial = x.shape[2:]
    strides = attrs.get("strides") or [1] * nd
    dilations = attrs.get("dilations") or [1] * nd
    extra = attrs.get("output_padding") or [0] * nd
    full = [s * (i - 1) + e + (k - 1) * d + 1 for s, i, e, k, d in zip(strides, spatial, extra, kernel, dilations)]
    pads, target = attrs.get("pads"), attrs.get("output_shape")
    if pads is None and attrs.get("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"):
        target = target or [i * s for i, s in zip(spatial, strides)]
        total = [f - t for f, t in zip(full, target)]
        upper = attrs["auto_pad"] == "SAME_UPPER"
        pads = [t // 2 if upper else t - t // 2 for t in total] + [t - t // 2 if upper else t // 2 for t in total]
    pads = pads or [0] * (2 * nd)
    target = target or [f - b - e for f, b, e in zip(full, pads[:nd], pads[nd:])]
    if (tuple(strides) == kernel and all(d == 1 for d in dilations) and not any(pads) and not any(extra)
            and list(target) == list(full)):
        return [_unpatchify(x, w, bias, group, kernel)]
    # GEMM: (Mg*K, Cg) @ (Cg, HW) per group, then scatter-add every tap into the output (col2im).
    cg = c // group
    weights = w.reshape(group, cg, outs * math.prod(kernel))
    cols = np.empty((n, group, outs * math.prod(kernel), math.prod(spatial)), dtype=x.dtype)
    xs = x.reshape(n, group, cg, -1)
    for g in range(group):
        np.matmul(weights[g].T, xs[:, g], out=cols[:, g])
    cols = cols.reshape((n, group * outs) + kernel + tuple(spatial))
    y = np.zeros((n, group * outs) + tuple(max(f, b + t) for f, b, t in zip(full, pads[:nd], target)), dtype=x.dtype)
    for index in itertools.product(*(range(k) for k in kernel)):
        window = (slice(None), slice(None)) + tuple(
            slice(k * d, k * d + (i - 1) * s + 1, s) for k, d, i, s in zip(index, dilations, spatial, strides))
        y[window] += cols[(slice(None), slice(None)) + index]
    y = y[(slice(None), slice(None)) + tuple(slice(b, b + t) for b, t in zip(pads[:nd], target))]
    if bias is not None:
        y = y + bias.reshape((-1,) + (1,) * nd)
    return [np.ascontiguousarray(y)]


def _unpatchify(x, w, bias, group: int, kernel: tuple) -> np.ndarray:
    """ConvTranspose with stride == kernel and no padding: taps never overlap, so every input pixel
    writes its own kernel-sized patch: one GEMM per group and one transposing copy, no col2im sums."""
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    outs, cg = w.shape[1], c // group
    taps = math.prod(kernel)
    cols = np.empty((n, group, outs * taps, math.prod(spatial)), dtype=x.dtype)
    xs = x.reshape(n, group, cg, -1)
    weights = w.reshape(group, cg, outs * taps)
    for image in range(n):
        for g in range(group):
            product_into(weights[g].T, xs[image, g], out=cols[image, g])
    out_shape = (n, group * outs) + tuple(s * k for s, k in zip(spatial, kernel))
    compiled = jit_conv.interleave_patches(cols, bias, out_shape, kernel)
    if compiled is not None:
        return compiled
    if bias is not None:
        cols.reshape(n, group * outs, taps * math.prod(spatial))[...] += bias.reshape(group * outs, 1)
    # (n, M, k1..kd, s1..sd) -> (n, M, s1, k1, ..., sd, kd), one strided copy per tap (a single
    # transposing copy walks the output with a stride of kd elements and measured 3x slower)
    patches = cols.reshape((n, group * outs) + kernel + tuple(spatial))
    y = np.empty(out_shape, dtype=x.dtype)
    interleaved = y.reshape((n, group * outs) + tuple(d for s, k in zip(spatial, kernel) for d in (s, k)))
    for index in itertools.product(*(range(k) for k in kernel)):
        target = (slice(None), slice(None)) + tuple(part for k in index for part in (slice(None), k))
        np.copyto(interleaved[target], patches[(slice(None), slice(None)) + index])
    return y


KERNELS = {
    ("", "Conv"): conv,
    ("com.microsoft", "FusedConv"): fused_conv,
    ("", "ConvTranspose"): conv_transpose,
}
