"""`infc.cpu.ExpertMatMul`: a mixture of experts' gathered-weight products as one GEMM per expert.

Exporters write a MoE layer's experts as batched MMs (transformers 5's `experts_implementation=
"batched_mm"`): every routed (token, expert) pair gathers its expert's whole weight, then multiplies
its one row by it. compiler/lower_experts.py turns the pair of steps into this one:

    MatMul(Gather(W [E, N, K], idx), x [R, K, P])  ->  ExpertMatMul(x, idx, Wt [E, K, N], weights_side=0)
    MatMul(x [R, P, K], Gather(W [E, K, N], idx))  ->  ExpertMatMul(x, idx, W  [E, K, N], weights_side=1)

Why: the gather copies R whole matrices (a 256-token prefill of a 4-layer, 8-expert model with
hidden 512: 1.6 GB per layer, 5 s of page faults) and then runs R matrix-vector products. Grouping
the rows by expert reads each weight once, in one GEMM of the rows routed to it: the same products,
summed by a GEMM instead of a GEMV (float32 rounding apart; 1000x faster on that prefill).

`batch_invariant` (set on decoder plans, compiler/decoder/batch_invariant.py): a row's result must
not depend on how many other rows reached its expert, so each expert's GEMM runs as the decoder's
own float32 GEMM step does (kernels/batch_invariant.py: the BLAS recipe checked row-invariant, the
chain kernel for decode rows, or infc's own order), with a step context of its own per expert.
Indices follow Gather's rules (negative ones count from the end; outside [-E, E) is an error); with
`index_depth` 1 they are GatherND's [.., 1] (dynamo exports), the last axis dropped.

int8 experts (`--precision w8`, quantize/expert_weights.py): a fourth input makes the third one int8
codes [E, K, N] and the fourth their float32 scales [E, N], one per expert and output channel; the
weight is codes x scale. Only the codes stay resident: each expert's weight is rebuilt per call into
one float32 scratch buffer of the step, [K, N], reused by every expert in turn. Under
`batch_invariant`, decode rows read the codes directly (runtime/code_chain_gemm.py: the sums the
float32 kernel makes of the rebuilt weight, bit for bit) and need no rebuild at all.
"""

from __future__ import annotations

import numpy as np

from ..invariant_gemm import codes_rows_product, min_rows, own_order_product, row_invariant_product
from .batch_invariant import batch_invariant
from .common import KernelContext

INNER_GEMM = {"inner_op": "MatMul", "inner_domain": "", "const_inputs": [1]}


def _expert_views(weights: np.ndarray, ctx: KernelContext) -> tuple[list[np.ndarray], list[KernelContext]]:
    """One [K, N] view per expert and one inner step context each, kept for the step: the inner GEMM
    step memoizes its packed panels against the very weight object it was given."""
    cached = ctx.memo.get("experts")
    if cached is None or cached[0] is not weights:
        views = [weights[e] for e in range(weights.shape[0])]
        cached = ctx.memo["experts"] = (weights, views, [KernelContext(ctx.opset) for _ in views])
    return cached[1], cached[2]


def _gathered(x, idx, weights, side, xp=np):
    """The unfused semantics (shapes the grouped form does not take): gather, then MatMul."""
    w = xp.take(weights, xp.asarray(idx), axis=0)  # [.., K, N]
    return xp.matmul(xp.swapaxes(w, -1, -2), x) if side == 0 else xp.matmul(x, w)


def routes(idx, x_shape, weights_shape, side: int) -> list[tuple[int, np.ndarray]] | None:
    """[(expert, the routed rows it serves)] for experts with rows, or None where x is not one operand
    per routed index (the gathered semantics then serve). `idx` is on the host. Raises IndexError as
    Gather does for an index outside [-E, E)."""
    experts, k, _ = weights_shape
    idx = np.asarray(idx).astype(np.int64, copy=False)
    if idx.size and (idx.min() < -experts or idx.max() >= experts):
        raise IndexError(f"ExpertMatMul: an expert index is outside [-{experts}, {experts})")
    if len(x_shape) != idx.ndim + 2 or tuple(x_shape[:-2]) != idx.shape or x_shape[-2 if side == 0 else -1] != k:
        return None
    flat = np.where(idx < 0, idx + experts, idx).reshape(-1)
    order = np.argsort(flat, kind="stable")
    bounds = np.searchsorted(flat[order], np.arange(experts + 1))
    return [(e, order[bounds[e]:bounds[e + 1]]) for e in range(experts) if bounds[e + 1] > bounds[e]]


def grouped_product(x, idx, weights, side: int, product, xp=np, float_weights=None):
    """ExpertMatMul's result with `product(rows [M, K], expert)` computing each expert's GEMM;
    `float_weights()`: the whole float weight, for the gathered semantics, where `weights` are codes."""
    groups = routes(idx, x.shape, weights.shape, side)
    if groups is None:
        return _gathered(x, idx, weights if float_weights is None else float_weights(), side, xp)
    k, n = weights.shape[1:]
    rows = (xp.swapaxes(x, -1, -2) if side == 0 else x).reshape(-1, x.shape[-1 if side == 0 else -2], k)  # [R, P, K]
    per_row = rows.shape[1]
    out = xp.empty((rows.shape[0], per_row, n), x.dtype)
    for e, chosen in groups:
        chosen = chosen if xp is np else xp.asarray(chosen)
        out[chosen] = product(rows[chosen].reshape(-1, k), e).reshape(-1, per_row, n)
    out = out.reshape(*np.shape(idx), per_row, n)
    return xp.ascontiguousarray(xp.swapaxes(out, -1, -2)) if side == 0 else out


def expert_indices(idx, attrs):
    """The routing indices as Gather's: GatherND's depth-1 indices [.., 1] lose their last axis."""
    if not attrs.get("index_depth"):
        return idx
    if idx.ndim == 0 or idx.shape[-1] != 1:
        raise ValueError(f"ExpertMatMul: GatherND indices of shape {list(idx.shape)} are not of depth 1")
    return idx[..., 0]


def dequantized(codes, scale, out=None, xp=np):
    """codes [.., K, N] int8 x scale [.., N] float32 (per expert and output channel), into `out` if given."""
    return xp.multiply(codes, xp.expand_dims(scale, -2), out=out, dtype=xp.float32)


def _scratch(codes: np.ndarray, ctx: KernelContext) -> np.ndarray:
    """The step's one float32 [K, N] buffer that each expert's weight is rebuilt into in turn."""
    buffer = ctx.memo.get("scratch")
    if buffer is None or buffer.shape != codes.shape[1:]:
        buffer = ctx.memo["scratch"] = np.empty(codes.shape[1:], np.float32)
    return buffer


def _int8_product(rows, e: int, codes, scale, ctx, invariant: bool) -> np.ndarray:
    """rows [M, K] by expert e's int8 weight: the float32 product with its rebuilt weight, in the
    decoder's row-invariant order when `invariant` (as kernels/batch_invariant.py runs a float32 weight)."""
    scratch = _scratch(codes, ctx)
    if not invariant:
        return rows @ dequantized(codes[e], scale[e], scratch)
    rows_from = min_rows(scratch)  # by shape: every expert's weight has the scratch buffer's layout
    zero = ctx.memo.get("zero")
    if zero is None or zero.shape[1] != codes.shape[2]:
        zero = ctx.memo["zero"] = np.zeros((1, codes.shape[2]), np.int8)
    y = codes_rows_product(rows, scratch, (codes[e], scale[e:e + 1], zero, codes.shape[1]), rows_from)
    if y is not None:  # decode rows (or, where no BLAS recipe serves, every row) from the codes
        return y
    w = dequantized(codes[e], scale[e], scratch)
    y = own_order_product(rows, w) if rows_from is None else row_invariant_product(rows, w, rows_from)
    return y if y is not None else (rows.astype(np.float64) @ w.astype(np.float64)).astype(np.float32)


def expert_matmul(inputs, attrs, ctx):
    x, idx, weights = inputs[:3]
    idx = expert_indices(idx, attrs)
    side = attrs.get("weights_side", 1)
    if len(inputs) == 4:  # int8 codes and their scales
        codes, scale = weights, inputs[3]
        if x.dtype != np.float32:
            return [_gathered(x, idx, dequantized(codes, scale).astype(x.dtype), side)]
        invariant = bool(attrs.get("batch_invariant"))
        return [grouped_product(x, idx, codes, side, lambda a, e: _int8_product(a, e, codes, scale, ctx, invariant),
                                float_weights=lambda: dequantized(codes, scale))]
    if x.dtype != weights.dtype:
        return [_gathered(x, idx, weights, side)]
    if attrs.get("batch_invariant") and weights.dtype == np.float32:
        views, contexts = _expert_views(weights, ctx)
        return [grouped_product(x, idx, weights, side,
                                lambda a, e: batch_invariant([a, views[e]], INNER_GEMM, contexts[e])[0])]
    return [grouped_product(x, idx, weights, side, lambda a, e: a @ weights[e])]


KERNELS = {("infc.cpu", "ExpertMatMul"): expert_matmul}
