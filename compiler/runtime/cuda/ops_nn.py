"""Device ops with reductions or GEMMs: softmax, layer / RMS norms (with ORT's skip forms), MatMul,
Gemm, convolution and pooling. GEMMs with a constant weight go through `ctx.gemm` (the step's tuned
choice per M: a generated kernel or cuBLAS, see gemm.py); convolutions become GEMMs by im2col with
the weight's own (Cout, Cin*kh*kw) layout as the (N, K) operand, depthwise ones a sum over taps."""

from __future__ import annotations

import math

from ..kernels.common import arg, norm_axis
from ..kernels.conv import geometry, taps
from ..kernels.expert_gemm import dequantized, expert_indices, grouped_product
from .gemm import split_residual
from .ops_elementwise import activate


def softmax(inputs, attrs, ctx):
    xp, x = ctx.xp, inputs[0]
    shape = x.shape
    if ctx.opset >= 13:
        axis = norm_axis(attrs.get("axis", -1), x.ndim)
    else:  # older opsets flatten to 2-D at `axis`
        split = norm_axis(attrs.get("axis", 1), x.ndim)
        x, axis = x.reshape(math.prod(shape[:split]), -1), 1
    if axis == x.ndim - 1 and ctx.rows is not None and ctx.rows.may_softmax(x):  # one launch (rows.py)
        return [ctx.rows.softmax(x, xp).reshape(shape)]
    e = xp.exp(x - x.max(axis=axis, keepdims=True))
    e /= e.sum(axis=axis, keepdims=True)
    return [e.reshape(shape)]


def _normalize(x, scale, bias, first_axis: int, eps: float, center: bool, xp):
    axes = tuple(range(first_axis, x.ndim))
    mean = x.mean(axis=axes, keepdims=True) if center else None
    centered = x - mean if center else x
    inv_std = 1.0 / xp.sqrt((centered * centered).mean(axis=axes, keepdims=True) + x.dtype.type(eps))
    y = centered * inv_std
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias
    return y.astype(x.dtype, copy=False), mean, inv_std


def layer_norm(inputs, attrs, ctx):
    x = inputs[0]
    axis, eps = norm_axis(attrs.get("axis", -1), x.ndim), attrs.get("epsilon", 1e-5)
    if ctx.rows is not None and ctx.rows.may_norm(x, axis, arg(inputs, 1), arg(inputs, 2)):
        y, mean, inv_std, _ = ctx.rows.norm(x, axis, inputs[1], ctx.xp, beta=arg(inputs, 2), eps=eps, center=True)
        return [y, mean, inv_std]
    y, mean, inv_std = _normalize(x, arg(inputs, 1), arg(inputs, 2), axis, eps, True, ctx.xp)
    return [y, mean, inv_std]


def rms_norm(inputs, attrs, ctx):
    x = inputs[0]
    axis, eps = norm_axis(attrs.get("axis", -1), x.ndim), attrs.get("epsilon", 1e-5)
    if ctx.rows is not None and ctx.rows.may_norm(x, axis, arg(inputs, 1)):
        y, _, inv_std, _ = ctx.rows.norm(x, axis, inputs[1], ctx.xp, eps=eps, center=False)
        return [y, inv_std]
    y, _, inv_std = _normalize(x, arg(inputs, 1), None, axis, eps, False, ctx.xp)
    return [y, inv_std]


def _skip_norm(center: bool):
    def op(inputs, attrs, ctx):
        x, skip, gamma = inputs[0], inputs[1], inputs[2]
        beta, bias = (arg(inputs, 3), arg(inputs, 4)) if center else (None, arg(inputs, 3))
        eps = attrs.get("epsilon", 1e-12)
        if ctx.rows is not None and ctx.rows.may_norm(x, x.ndim - 1, gamma, beta, bias, skip=skip):
            return list(ctx.rows.norm(x, x.ndim - 1, gamma, ctx.xp, beta=beta, bias=bias, skip=skip, eps=eps,
                                      center=center, want_total=len(ctx.out) > 3))
        total = x + skip
        if bias is not None:
            total = total + bias
        y, mean, inv_std = _normalize(total, gamma, beta, total.ndim - 1, eps, center, ctx.xp)
        return [y, mean, inv_std, total]
    return op


def _rows(x, xp):
    """(..., K) -> contiguous (M, K): the A operand (or the residual) of a GEMM site."""
    return xp.ascontiguousarray(x.reshape(-1, x.shape[-1]))


def matmul(inputs, attrs, ctx):
    (a, b), residual = split_residual(inputs, ctx.gemm)
    if ctx.gemm is not None and b.ndim == 2 and a.ndim >= 1:
        out = ctx.gemm(_rows(a, ctx.xp), None if residual is None else _rows(residual, ctx.xp))
        return [out.reshape(a.shape[:-1] + (out.shape[-1],))]
    return [ctx.xp.matmul(a, b)]


def gemm(inputs, attrs, ctx):
    inputs, residual = split_residual(inputs, ctx.gemm)
    a, b, c = inputs[0], inputs[1], arg(inputs, 2)
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    a = a.T if attrs.get("transA", 0) else a
    if ctx.gemm is not None:  # the site holds B as (N, K)
        y = ctx.gemm(ctx.xp.ascontiguousarray(a), None if residual is None else ctx.xp.ascontiguousarray(residual))
    else:
        y = ctx.xp.matmul(a, b.T if attrs.get("transB", 0) else b)
    if alpha != 1.0:
        y = y * y.dtype.type(alpha)
    if c is not None and beta != 0.0 and not (ctx.gemm is not None and ctx.gemm.spec.owns("bias")):
        y = y + (c if beta == 1.0 else c * c.dtype.type(beta))
    return [y.astype(a.dtype, copy=False)]


def _padded(x, geo, xp, value=0.0):
    """x inside a border of `value`: one fill and one copy (CuPy's pad is a launch per side and axis)."""
    if not any(geo.pads_begin) and not any(geo.pads_end):
        return x
    shape = x.shape[:2] + tuple(d + b + e for d, b, e in zip(x.shape[2:], geo.pads_begin, geo.pads_end))
    out = xp.full(shape, value, dtype=x.dtype)
    out[(slice(None), slice(None)) + tuple(slice(b, b + d) for b, d in zip(geo.pads_begin, x.shape[2:]))] = x
    return out


def patch_rows(xpad, kernel, geo, xp):
    """im2col as one strided view and one copy: (N * prod(out), C * prod(kernel)) rows, columns ordered
    (c, k1, k2, ...) as the weight (M, C, *kernel) reshapes; one launch where a slice per tap was many."""
    n, c = xpad.shape[:2]
    sn, sc, *spatial = xpad.strides
    shape = (n, *geo.out, c, *kernel)
    strides = (sn, *(st * s for st, s in zip(spatial, geo.strides)), sc, *(st * d for st, d in zip(spatial, geo.dilations)))
    view = xp.lib.stride_tricks.as_strided(xpad, shape=shape, strides=strides)
    return xp.ascontiguousarray(view).reshape(-1, c * math.prod(kernel))


def conv_forward(x, w, bias, attrs, ctx, residual=None):
    xp = ctx.xp
    n, c = x.shape[:2]
    m, group = w.shape[0], attrs.get("group", 1)
    kernel = tuple(attrs.get("kernel_shape") or w.shape[2:])
    geo = geometry(x.shape[2:], kernel, attrs)
    xpad = _padded(x, geo, xp)
    if group == 1:
        a = patch_rows(xpad, kernel, geo, xp)
        y2d = ctx.gemm(a) if ctx.gemm is not None else xp.matmul(a, w.reshape(m, -1).T)
        y = y2d.reshape((n,) + geo.out + (m,))
        y = xp.ascontiguousarray(xp.moveaxis(y, -1, 1))
        return _conv_tail(y, bias, residual, m, kernel, x.dtype)
    cols = [xpad[window] for _, window in taps(kernel, geo)]  # each (N, C, *out)
    if group == c == m and w.shape[1] == 1:  # depthwise: a weighted sum of the taps
        taps_w = w.reshape(m, -1)
        y = None
        for t, col in enumerate(cols):
            term = col * taps_w[:, t].reshape((1, m) + (1,) * len(kernel))
            y = term if y is None else y + term
    else:
        per = c // group
        pieces = []
        for g in range(group):
            sub = xp.stack([col[:, g * per:(g + 1) * per] for col in cols], axis=2)
            a = xp.ascontiguousarray(sub.transpose((0,) + tuple(range(3, sub.ndim)) + (1, 2))).reshape(-1, per * len(cols))
            wg = w[g * (m // group):(g + 1) * (m // group)].reshape(m // group, -1)
            pieces.append(xp.matmul(a, wg.T).reshape((n,) + geo.out + (m // group,)))
        y = xp.ascontiguousarray(xp.moveaxis(xp.concatenate(pieces, axis=-1), -1, 1))
    return _conv_tail(y, bias, residual, m, kernel, x.dtype)


def _conv_tail(y, bias, residual, m: int, kernel, dtype):
    if bias is not None:
        y = y + bias.reshape((1, m) + (1,) * len(kernel))
    if residual is not None:
        y = y + residual
    return y.astype(dtype, copy=False)


def _own(ctx, part: str) -> bool:
    return ctx.gemm is not None and ctx.gemm.spec.owns(part)


def conv(inputs, attrs, ctx):
    return [conv_forward(inputs[0], inputs[1], None if _own(ctx, "bias") else arg(inputs, 2), attrs, ctx)]


def fused_conv(inputs, attrs, ctx):
    y = conv_forward(inputs[0], inputs[1], None if _own(ctx, "bias") else arg(inputs, 2), attrs, ctx,
                     residual=arg(inputs, 3))
    return [y if _own(ctx, "act") else activate(y, attrs.get("activation"), attrs.get("activation_params"), ctx)]


def global_average_pool(inputs, attrs, ctx):
    x = inputs[0]
    return [x.mean(axis=tuple(range(2, x.ndim)), keepdims=True).astype(x.dtype, copy=False)]


def global_max_pool(inputs, attrs, ctx):
    x = inputs[0]
    return [x.max(axis=tuple(range(2, x.ndim)), keepdims=True)]


def max_pool(inputs, attrs, ctx):
    x = inputs[0]
    if attrs.get("ceil_mode", 0) or attrs.get("storage_order", 0):
        raise NotImplementedError("MaxPool ceil_mode / storage_order on the device")  # the executor places it on the host
    kernel = tuple(attrs["kernel_shape"])
    geo = geometry(x.shape[2:], kernel, attrs)
    xpad = _padded(x, geo, ctx.xp, value=-math.inf)
    y = None
    for _, window in taps(kernel, geo):
        y = xpad[window] if y is None else ctx.xp.maximum(y, xpad[window])
    return [ctx.xp.ascontiguousarray(y)]


max_pool.may_run = lambda attrs: not attrs.get("ceil_mode", 0) and not attrs.get("storage_order", 0)

def expert_matmul(inputs, attrs, ctx):
    """infc.cpu.ExpertMatMul (runtime/kernels/expert_gemm.py): one device GEMM per expert over the rows
    routed to it; the routing indices are read on the host, which decides the groups. int8 experts
    (codes and scales, `--precision w8`): each expert's weight rebuilt on the device per call."""
    x, idx, weights = inputs[:3]
    xp, side, idx = ctx.xp, attrs.get("weights_side", 1), expert_indices(idx, attrs)
    if len(inputs) == 4:
        scale = inputs[3]
        return [grouped_product(x, idx, weights, side, lambda a, e: xp.matmul(a, dequantized(weights[e], scale[e], xp=xp)), xp,
                                float_weights=lambda: dequantized(weights, scale, xp=xp))]
    return [grouped_product(x, idx, weights, side, lambda a, e: xp.matmul(a, weights[e]), xp)]


expert_matmul.host_inputs = (1,)


NN = {
    ("", "Softmax"): softmax, ("", "LayerNormalization"): layer_norm,
    ("", "RMSNormalization"): rms_norm, ("", "SimplifiedLayerNormalization"): rms_norm,
    ("com.microsoft", "SkipLayerNormalization"): _skip_norm(True),
    ("com.microsoft", "SkipSimplifiedLayerNormalization"): _skip_norm(False),
    ("", "MatMul"): matmul, ("", "Gemm"): gemm, ("", "Conv"): conv, ("com.microsoft", "FusedConv"): fused_conv,
    ("infc.cpu", "ExpertMatMul"): expert_matmul,
    ("", "GlobalAveragePool"): global_average_pool, ("", "GlobalMaxPool"): global_max_pool, ("", "MaxPool"): max_pool,
}
