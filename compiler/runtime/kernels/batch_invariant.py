"""`infc.BatchInvariant`: a GEMM step of a decoder plan whose result for a row must not depend on how
many rows the step has (attrs: inner_op, inner_domain, const_inputs, plus the inner op's own;
`weight_group` when three more inputs give the weight as 8-bit codes, scales and zero points
blocked along K: decode rows then read those, runtime/code_chain_gemm.py, and every row in infc's
own order does, on code panels, runtime/panel_gemm.py; with `row_quantized` too, the model
quantizes the activations as well and every row is quantized on its own, runtime/row_quantized_gemm.py), and
`infc.Float64`, the same step always in float64 (what plans built before float32 GEMMs hold).

A float32 MatMul by a 2-D weight runs in float32 through invariant_gemm: the fixed BLAS recipe this
machine was checked to keep row-invariant, rows padded up to the shape's threshold (decode-sized
rows on the chain kernel, or with its sums on wide panels where the CPU has 512-bit vectors, codes
steps on wide panels of their codes); a shape whose probe failed runs every row count in its own fixed order,
on the weight packed into panels (runtime/panel_gemm.py). Anything else (other inner ops, other dtypes, compiled kernels off) runs the inner
op in float64 and rounds back (`float64_op`), which is invariant whatever the BLAS does, at twice
the cost.
"""

from __future__ import annotations

import numpy as np

from .. import jit
from ..invariant_gemm import decode_edges, codes_rows_product, min_rows, own_edges, own_order_product, row_invariant_product
from ...plan.format import release_mapped_pages
from ..panel_gemm import (WIDE_PANEL, code_panel_product, has_wide_vectors, pack_code_panels, pack_delta_panels,
                          pack_panels, panel_product)
from ..row_quantized_gemm import ROW_QUANTIZED, RowQuantizedWeight
from .common import KernelContext
from .quant import dequantize_linear


def _float32_rows(inputs, attrs) -> tuple[np.ndarray, np.ndarray] | None:
    """(rows [M, K], weight [K, N]) when the step is a float32 MatMul by a 2-D weight."""
    if (attrs["inner_domain"], attrs["inner_op"]) != ("", "MatMul") or len(inputs) != (5 if "weight_group" in attrs else 2):
        return None
    a, w = inputs[:2]
    if a is None or w is None or a.dtype != np.float32 or w.dtype != np.float32 or w.ndim != 2 or a.ndim < 2:
        return None
    if a.shape[-1] != w.shape[0] or 0 in a.shape or 0 in w.shape:
        return None
    return a.reshape(-1, w.shape[0]), w


def _one_row_stacks(inputs, attrs) -> np.ndarray | None:
    """A float32 MatMul of stacks of single rows by stacks of their own matrices, [..., 1, K] @ [..., K, N]
    with the same leading dims (a mixture of experts exported as batched MMs: each token's row by the
    weight of the expert it was routed to, gathered): every stack entry is one product of fixed shape,
    whatever else the step holds, so float32 is batch-invariant as it is. Its product, else None."""
    if (attrs["inner_domain"], attrs["inner_op"]) != ("", "MatMul") or len(inputs) != 2 or "weight_group" in attrs:
        return None
    a, w = inputs
    if a is None or w is None or a.dtype != np.float32 or w.dtype != np.float32 or a.ndim < 3 or a.ndim != w.ndim:
        return None
    if a.shape[-2] != 1 or a.shape[:-2] != w.shape[:-2] or a.shape[-1] != w.shape[-2]:
        return None
    return np.matmul(a, w)


def float64_op(inputs, attrs, ctx):
    """attrs: inner_op, inner_domain, const_inputs (indexes of weights: cast once, kept in the memo)."""
    inner = ctx.memo.get("kernel")
    if inner is None:
        from . import kernel_for  # the registry imports this module

        inner = ctx.memo["kernel"] = kernel_for(attrs["inner_domain"], attrs["inner_op"])
    if "weight_group" in attrs:  # the codes only restate the weight
        inputs = inputs[:2]
    cast = []
    for index, x in enumerate(inputs):
        if x is None or x.dtype != np.float32:
            cast.append(x)
        elif index in attrs["const_inputs"]:
            cached = ctx.memo.get(index)
            if cached is None or cached[0] is not x:
                cached = ctx.memo[index] = (x, x.astype(np.float64))
            cast.append(cached[1])
        else:
            cast.append(x.astype(np.float64))
    inner_attrs = {k: v for k, v in attrs.items() if k not in ("inner_op", "inner_domain", "const_inputs", "weight_group", ROW_QUANTIZED)}
    inner_ctx = ctx.memo.setdefault("ctx", KernelContext(ctx.opset))  # no (float32) output buffers
    results = inner(cast, inner_attrs, inner_ctx)
    return [r.astype(np.float32) if r is not None and r.dtype == np.float64 else r for r in results]


def _panels(w: np.ndarray, ctx) -> np.ndarray | None:
    """The weight packed for the own-order panel kernel, once per step, when compiled kernels are on:
    the step's memo keeps (weight, panels, cut of K) under "own", which later calls go straight to;
    the plan's mapped weight gives its resident pages back."""
    own = ctx.memo.get("own")
    if own is None or own[0] is not w:
        if not jit.enabled():
            return None
        own = ctx.memo["own"] = (w, pack_panels(w), own_edges(w.shape[0]))
        release_mapped_pages(w)  # read again only if compiled kernels are turned off
    return own[1]


def _wide_panels(w: np.ndarray, ctx) -> np.ndarray | None:
    """The weight packed in wide panels for its decode rows, once per step (kept in the step's memo),
    when compiled kernels are on. The BLAS still reads the weight itself for prefill rows, so its
    mapped pages are given back and come back from the page cache when a prefill reads them: a
    decode-only stretch holds the panels alone, a prefill both (clean file pages, which the kernel
    may reclaim)."""
    cached = ctx.memo.get("wide_panels")
    if cached is None or cached[0] is not w:
        if not jit.enabled():
            return None
        cached = ctx.memo["wide_panels"] = (w, pack_panels(w, WIDE_PANEL))
        release_mapped_pages(w)
    return cached[1]


def _code_panels(parts, group: int, ctx) -> tuple | None:
    """The weight's codes, scales and zero points packed for the code panel kernel, once per step
    (kept in the step's memo), when compiled kernels are on: where the CPU has 512-bit vectors, wide
    panels of deltas (code - zero) when they fit in int8, else of the codes; elsewhere panels of the codes."""
    cached = ctx.memo.get("code_panels")
    if cached is None or cached[0] is not parts[0]:
        if not jit.enabled():
            return None
        if has_wide_vectors():
            packed = pack_delta_panels(*parts, group, WIDE_PANEL) or pack_code_panels(*parts, WIDE_PANEL)
        else:
            packed = pack_code_panels(*parts)
        cached = ctx.memo["code_panels"] = (parts[0], packed)
        for part in parts:  # read again only by the codes chain loop, if compiled kernels are turned off
            release_mapped_pages(part)
    return cached[1]


def _row_quantized(parts, ctx) -> RowQuantizedWeight:
    """The step's codes, scales and zero points (one per column) ready for row-quantized products, once
    per step (kept in the step's memo)."""
    cached = ctx.memo.get("row_quantized")
    if cached is None or cached[0] is not parts[0]:
        cached = ctx.memo["row_quantized"] = (parts[0], RowQuantizedWeight(*parts))
        cached[1].prepare()  # its prefill session now, in the runner's warm-up, not in a request's TTFT
    return cached[1]


def _row_quantized_step(inputs, ctx):
    """A step reading only W's codes (input 1 empty, attr ROW_QUANTIZED): float32 rows quantized one
    by one; anything else in float64 on the dequantized weight."""
    weight = _row_quantized(inputs[2:], ctx)
    a, n = inputs[0], weight.codes.shape[1]
    if a is None or a.dtype != np.float32 or a.ndim < 2 or a.shape[-1] != weight.codes.shape[0]:
        return None
    if a.size == 0:
        return [np.zeros((*a.shape[:-1], n), np.float32)]
    return [weight.product(a.reshape(-1, a.shape[-1])).reshape(*a.shape[:-1], n)]


def batch_invariant(inputs, attrs, ctx):
    if attrs.get(ROW_QUANTIZED):  # the model quantizes these activations: per row, at integer speed
        result = _row_quantized_step(inputs, ctx)
        if result is not None:
            return result
        weight = dequantize_linear(list(inputs[2:]), {"axis": 0, "block_size": attrs["weight_group"]}, None)[0]
        return float64_op([inputs[0], weight], attrs, ctx)
    own = ctx.memo.get("own")  # (weight, panels, edges) once the weight is known to run on panels
    a = inputs[0]
    if own is not None and len(inputs) == 2 and inputs[1] is own[0] and a is not None and a.dtype == np.float32 \
            and a.ndim >= 2 and a.shape[-1] == own[0].shape[0] and a.size:  # a decode step's 122 GEMMs: no re-checks
        y = panel_product(a.reshape(-1, a.shape[-1]), own[1], own[0].shape[1], own[2])
        if y is not None:
            return [y.reshape(*a.shape[:-1], own[0].shape[1])]
    operands = _float32_rows(inputs, attrs)
    if operands is None:
        stacked = _one_row_stacks(inputs, attrs)  # not a 2-D weight: rows by their own matrices, or float64
        return [stacked] if stacked is not None else float64_op(inputs, attrs, ctx)
    rows, w = operands
    rows_from = min_rows(w)
    y = None
    if "weight_group" in attrs:
        group = attrs["weight_group"]
        # the register tiles on code panels: in infc's own order every row (2-3x the chain loop on AVX2,
        # decode rows too); where a BLAS recipe serves the float32 rows, the decode rows under it, on
        # 512-bit vectors only (eight-lane tiles lose to the codes chain loop there: 41 against 31 ms
        # for SmolLM2's weights at one row, one Sapphire Rapids core; sixteen-lane tiles take 23)
        edges = decode_edges(w, rows.shape[0], rows_from)
        if edges is not None and (rows_from is None or has_wide_vectors()):
            packed = _code_panels(inputs[2:], group, ctx)
            y = None if packed is None else code_panel_product(rows, packed, w.shape[1], group, edges)
        if y is None:
            y = codes_rows_product(rows, w, (*inputs[2:], group), rows_from)
    if y is None and rows_from is not None and has_wide_vectors():
        # the rows the chain kernel serves (decode rows), on wide panels with its cut of K: the same
        # bits, each thread streaming its columns in one run (SmolLM2's weights, one row, one core:
        # 46 -> 40 ms; decode steps 0.87-0.93x)
        edges = decode_edges(w, rows.shape[0], rows_from)
        if edges is not None:
            wide = _wide_panels(w, ctx)
            y = None if wide is None else panel_product(rows, wide, w.shape[1], edges)
    if y is None:
        y = own_order_product(rows, w, _panels(w, ctx)) if rows_from is None else row_invariant_product(rows, w, rows_from)
    if y is None:
        return float64_op(inputs, attrs, ctx)
    return [y.reshape(*inputs[0].shape[:-1], w.shape[1])]


KERNELS = {
    ("infc", "BatchInvariant"): batch_invariant,
    ("infc", "Float64"): float64_op,
}
