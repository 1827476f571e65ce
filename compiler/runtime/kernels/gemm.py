"""Matrix products through np.matmul (BLAS): MatMul, Gemm, com.microsoft FusedMatMul / FusedGemm,
plus Einsum and Det. Float32 stays float32 (no float64 accumulation)."""

from __future__ import annotations

import numpy as np

from ..gemm_impls import product_into
from .common import arg, is_exotic, to_compute
from ...fused_activations import ACTIVATION_ATTRS
from .conv import apply_activation


def _into(ctx, shape, dtype):
    out = ctx.out_buffer(0)
    return out if out is not None and out.shape == shape and out.dtype == dtype else None


def product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b; a stack of rows times one 2-D matrix is a single BLAS call on (M*batch, K), run by
    gemm_impls.product_into (one BLAS thread, large ones shared with the helper thread)."""
    if b.ndim == 2 and a.ndim >= 2 and a.dtype == b.dtype and a.dtype.kind == "f":
        if a.ndim == 2:
            return product_into(a, b)
        if a.flags.c_contiguous or a.size == a.shape[-2] * a.shape[-1]:  # rows stack, or one matrix (a view)
            rows = a.reshape(-1, a.shape[-1]) if a.flags.c_contiguous else a.reshape(a.shape[-2:])
            return product_into(rows, b).reshape(a.shape[:-1] + (b.shape[1],))
    return np.matmul(a, b)


def matmul(inputs, attrs, ctx):
    a, b = inputs
    if is_exotic(a.dtype):
        return [np.matmul(to_compute(a), to_compute(b)).astype(a.dtype)]
    if ctx.out and ctx.out[0] is not None and a.ndim >= 2 and b.ndim >= 2:
        shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
        out = _into(ctx, shape, a.dtype)
        if out is not None:
            return [np.matmul(a, b, out=out)]
    return [product(a, b)]


def _swap_last(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2) if x.ndim >= 2 else x


def _batch_first_last(x: np.ndarray) -> np.ndarray:
    # transBatch: [d0, d1, ..., dn-2, dn-1] -> [d1, ..., dn-2, d0, dn-1]
    return np.transpose(x, tuple(range(1, x.ndim - 1)) + (0, x.ndim - 1)) if x.ndim > 2 else x


def fused_matmul(inputs, attrs, ctx):
    a, b = inputs
    if attrs.get("transBatchA", 0):
        a = _batch_first_last(a)
    if attrs.get("transBatchB", 0):
        b = _batch_first_last(b)
    if attrs.get("transA", 0):
        a = _swap_last(a)
    if attrs.get("transB", 0):
        b = _swap_last(b)
    y = product(a, b)
    alpha = attrs.get("alpha", 1.0)
    if alpha != 1.0:
        y *= np.asarray(alpha, dtype=y.dtype)
    return [y]


def gemm_forward(inputs, attrs) -> np.ndarray:
    a, b, c = inputs[0], inputs[1], arg(inputs, 2)
    if attrs.get("transA", 0):
        a = a.T
    if attrs.get("transB", 0):
        b = b.T
    y = product(a, b)
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if alpha != 1.0:
        y *= np.asarray(alpha, dtype=y.dtype)
    if c is not None and beta != 0.0:
        if y.dtype.kind != "f":
            y = y + (c * beta if beta != 1.0 else c).astype(y.dtype)
        else:
            y += c if beta == 1.0 else c * np.asarray(beta, dtype=y.dtype)
    return y


def gemm(inputs, attrs, ctx):
    return [gemm_forward(inputs, attrs)]


# FusedGemm's activation attributes in activation_params order (Clip's bounds as alpha and beta)
FUSED_GEMM_PARAMS = {**ACTIVATION_ATTRS, "Clip": (("alpha", -np.inf), ("beta", np.inf))}


def fused_gemm(inputs, attrs, ctx):
    y = gemm_forward(inputs, attrs)
    name = attrs.get("activation")
    params = [attrs.get(f"activation_{key}", default) for key, default in FUSED_GEMM_PARAMS.get(name, ())]
    return [apply_activation(y, name, params)]


def einsum(inputs, attrs, ctx):
    equation = attrs["equation"].replace(" ", "")
    result = np.einsum(equation, *(to_compute(x) for x in inputs), optimize=len(inputs) > 2)
    return [np.asarray(result).astype(inputs[0].dtype, copy=False)]


def det(inputs, attrs, ctx):
    x = inputs[0]
    return [np.linalg.det(to_compute(x)).astype(x.dtype, copy=False)]


KERNELS = {
    ("", "MatMul"): matmul,
    ("", "Gemm"): gemm,
    ("", "Einsum"): einsum,
    ("", "Det"): det,
    ("com.microsoft", "FusedMatMul"): fused_matmul,
    ("com.microsoft", "FusedGemm"): fused_gemm,
}
