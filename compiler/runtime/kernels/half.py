"""float16 data through the float32 kernels, as onnxruntime's CPU provider runs it.

NumPy has no BLAS path for float16 (its matmul runs at under 1 GFLOP/s here) and reduces float16
rows in float16. onnxruntime's CPU provider has few float16 kernels: its InsertCastTransformer runs
the others in float32 between Casts, so a float16 model's ops compute in float32 and round their
results to float16. The kernels named in WIDENED do the same here: float16 inputs are widened,
the float32 kernel runs, and the outputs that follow the input type are rounded back.

Constant inputs (weights, read-only in a loaded plan) are widened once per step and kept in the
step's memo; activations are widened on every call.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .common import KernelContext
from .jit_half import float16_to_float32, float32_to_float16

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
ALL = None  # every output follows the input type

# (domain, op) -> the outputs that have the input type (the rest keep theirs, as LayerNormalization's
# float32 mean and inverse std do; SkipLayerNormalization's skip sum, output 3, is T again: left
# float32, it fed a float16 island float32 data, fuzz_graphs seed 1137).
WIDENED: dict[tuple[str, str], tuple[int, ...] | None] = {
    **{("", op): ALL for op in ("MatMul", "Gemm", "Einsum", "Conv", "ConvTranspose", "Softmax", "LogSoftmax",
                                "InstanceNormalization", "GroupNormalization", "BatchNormalization",
                                "ReduceMean", "ReduceSum", "ReduceL2", "ReduceLogSumExp", "GlobalAveragePool",
                                "AveragePool", "Resize")},
    ("", "LayerNormalization"): (0,),
    ("", "RMSNormalization"): (0,),
    **{("com.microsoft", op): ALL for op in ("FusedMatMul", "FusedGemm", "FusedConv", "BiasGelu", "FastGelu")},
    ("com.microsoft", "SkipLayerNormalization"): (0, 3),
    ("com.microsoft", "SkipSimplifiedLayerNormalization"): (0, 3),
    ("infc.cpu", "ConvEpilogue"): ALL,
}


def widen_half(kernel: Callable, typed_outputs: tuple[int, ...] | None) -> Callable:
    def run(inputs, attrs, ctx: KernelContext):
        if not any(x is not None and getattr(x, "dtype", None) == F16 for x in inputs):
            return kernel(inputs, attrs, ctx)
        memo = ctx.memo.setdefault("half", {})
        wide = [_widened(x, position, memo) for position, x in enumerate(inputs)]
        # an offered output buffer is float16: the float32 kernel allocates its own
        results = kernel(wide, attrs, KernelContext(ctx.opset, [None] * len(ctx.out), ctx.memo))
        typed = range(len(results)) if typed_outputs is None else typed_outputs
        return [float32_to_float16(r) if i in typed and r is not None and r.dtype == F32 else r for i, r in enumerate(results)]
    run.accepts_out = getattr(kernel, "accepts_out", False)  # float32 data keeps the donated buffers
    run.__wrapped__ = kernel
    return run


def _widened(x, position: int, memo: dict):
    if x is None or getattr(x, "dtype", None) != F16:
        return x
    if x.flags.writeable:  # an activation (or a weight before the plan is written): changes every call
        return float16_to_float32(x)
    cached = memo.get(position)
    if cached is None or cached[0] is not x:
        cached = memo[position] = (x, x.astype(F32))
    return cached[1]
