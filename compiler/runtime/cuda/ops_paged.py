"""Device ops of decoder plans: infc.PagedAttention over K/V pools that live on the device, and the
decoder's GEMM steps (infc.BatchInvariant, infc.Float64), with the semantics of the CPU kernels in
runtime/kernels/paged_attention.py and batch_invariant.py.

The step's metadata (slot_mapping, block_tables, query_start_loc, context_lens) are read on the
host (`host_inputs`): which rows decode and how long each context is are host decisions, so no
launch waits on a device-to-host copy; only the slots, row indexes and masks go to the device.
The pools are the model runner's (model_runner.py allocates them with the backend's xp) and are
written in place, as on the CPU.

Attention is the plan's paged-attention kernel (templates/paged_attention.cuh, launched by rows.py:
K/V read in place, every row's sums in an order fixed by its own keys), else array ops over the
gathered blocks in float32: one batched pass for the decode rows, one per prefilling sequence. A GEMM
step is its inner op's device op (MatMul, Gemm: cuBLAS through xp.matmul). cuBLAS does not promise that a row's result is independent of the batch around it, as the CPU
kernels do: the plan says so (decoder["batch_invariant"]: false, decoder/device_plan.py).
"""

from __future__ import annotations

import numpy as np

from ..kernels.paged_attention import _attend_numpy
from ..row_quantized_gemm import ROW_QUANTIZED


def _write_kv(pool, new_BNTH, slots: np.ndarray, xp) -> None:
    """Rows of the [num_blocks, kvN, block_size, H] pool at `slots`, through one flat scatter."""
    if not pool.flags.c_contiguous:  # a reshape would copy, and the write would be lost
        raise ValueError("a KV pool must be C-contiguous")
    _, kv_heads, block_size, head_dim = pool.shape
    slots = np.asarray(slots, np.int64)
    heads = np.arange(kv_heads, dtype=np.int64)
    rows = ((slots[:, None] // block_size) * kv_heads + heads[None, :]) * block_size + slots[:, None] % block_size
    values = new_BNTH[0].transpose(1, 0, 2).reshape(-1, head_dim)  # [T * kvN, H], token-major as rows
    pool.reshape(-1, head_dim)[xp.asarray(rows.reshape(-1))] = values.astype(pool.dtype, copy=False)


def paged_attention(inputs, attrs, ctx):
    q, k_new, v_new, k_pool, v_pool, slots, tables, starts, context_lens = inputs
    xp = ctx.xp
    _write_kv(k_pool, k_new, slots, xp)
    _write_kv(v_pool, v_new, slots, xp)
    heads, kv_heads = attrs["num_heads"], attrs["kv_num_heads"]
    slopes = np.asarray(attrs.get("alibi_slopes", ()), np.float32)
    sinks = np.asarray(attrs.get("sinks", ()), np.float32)
    # the plan's kernel has no sinks (gpt-oss): those layers take the array path below
    if ctx.rows is not None and not sinks.size and ctx.rows.may_paged(q, k_pool, heads, kv_heads):  # the plan's kernel: pools read in place
        out = ctx.rows.paged_attention(q, k_pool, v_pool, np.asarray(tables), np.asarray(starts), np.asarray(context_lens),
                                       xp, num_heads=heads, kv_heads=kv_heads, scale=float(attrs["scale"]),
                                       softcap=float(attrs.get("softcap", 0.0)), window=int(attrs.get("window", 0)),
                                       slopes=slopes)
        return [out.reshape(q.shape)]
    out = _attend_numpy(q, k_pool, v_pool, np.asarray(tables), np.asarray(starts), np.asarray(context_lens),
                        heads, kv_heads, attrs["scale"], float(attrs.get("softcap", 0.0)), int(attrs.get("window", 0)),
                        slopes, xp=xp, compute=np.float32, sinks=sinks)
    return [out.reshape(q.shape)]


paged_attention.host_inputs = (5, 6, 7, 8)


STEP_KEYS = ("inner_op", "inner_domain", "const_inputs", "weight_group", ROW_QUANTIZED)  # the wrapper's attributes, not the inner op's


def _inner_op(attrs: dict):
    """(the inner op's device op or None, its attributes)."""
    from .ops import device_op_for  # noqa: PLC0415 - the table imports this module

    inner_attrs = {k: v for k, v in attrs.items() if k not in STEP_KEYS}
    return device_op_for(attrs.get("inner_domain") or "", attrs.get("inner_op"), inner_attrs), inner_attrs


def _gemm_step_in(compute):
    """A decoder GEMM step (MatMul, Gemm, ...) as its inner device op, float inputs in `compute`, the
    outputs back in the first input's type. The plan's device build folds weight codes away
    (decoder/device_plan.py), so the step's inputs are the inner op's."""
    def gemm(inputs, attrs, ctx):
        if "inner" not in ctx.memo:
            ctx.memo["inner"] = _inner_op(attrs)
        op, inner_attrs = ctx.memo["inner"]
        kind = inputs[0].dtype
        cast = [x.astype(compute, copy=False) if x is not None and x.dtype.kind == "f" else x for x in inputs]
        return [y.astype(kind, copy=False) if y is not None and y.dtype.kind == "f" else y
                for y in op(cast, inner_attrs, ctx)]

    gemm.may_run = lambda attrs: "weight_group" not in attrs and _inner_op(attrs)[0] is not None
    return gemm


DECODER = {
    ("infc", "PagedAttention"): paged_attention,
    ("infc", "BatchInvariant"): _gemm_step_in(np.float32),
    ("infc", "Float64"): _gemm_step_in(np.float64),
}
