"""Which ops compute in fp32 inside an fp16/bf16 model, and why: rules as data.

`DEFAULT_FP32_OPS` pins an op to fp32 (Casts around it, its outputs stay fp32). `FOLLOW_FP32_OPS`
are cheap elementwise and data-movement ops that keep computing in fp32 when any of their runtime
inputs is already fp32, so the ops around a pinned one form one fp32 island (fewer Cast pairs, and
e.g. `x - mean` next to a pinned ReduceMean keeps its precision). Heavy ops (MatMul, Gemm, Conv,
attention) never follow: they are what the reduced precision is for.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from ml_dtypes import bfloat16

LOW_PRECISIONS = {"fp16": onnx.TensorProto.FLOAT16, "bf16": onnx.TensorProto.BFLOAT16}
NUMPY_DTYPES = {onnx.TensorProto.FLOAT16: np.dtype(np.float16), onnx.TensorProto.BFLOAT16: np.dtype(bfloat16),
                onnx.TensorProto.FLOAT: np.dtype(np.float32)}

_NORM = "normalization: mean and variance over the whole row accumulate many terms and square them"
_REDUCE = "accumulates many terms; fp16 sums lose digits and overflow past 65504"

DEFAULT_FP32_OPS: dict[str, str] = {
    "LayerNormalization": _NORM,
    "SimplifiedLayerNormalization": _NORM,
    "SkipLayerNormalization": _NORM,
    "SkipSimplifiedLayerNormalization": _NORM,
    "RMSNormalization": _NORM,
    "GroupNormalization": _NORM,
    "InstanceNormalization": _NORM,
    "MeanVarianceNormalization": _NORM,
    "BatchNormalization": "running variances below 6.1e-5 are fp16 subnormals (few digits); 1/sqrt(var + eps) amplifies that",
    "LpNormalization": _NORM,
    "ReduceMean": _REDUCE,
    "ReduceSum": _REDUCE,
    "ReduceSumSquare": "squares overflow fp16 above 256, then accumulates",
    "ReduceL2": "squares overflow fp16 above 256, then accumulates",
    "ReduceLogSumExp": "exp overflows fp16 above 11.1, then accumulates",
    "ReduceProd": "products overflow and underflow quickly",
    "CumSum": "running sums grow without bound",
    "GlobalAveragePool": "mean over every spatial position: thousands of terms",
    "Pow": "x^2 in variance computations overflows fp16 above 256; other exponents over/underflow",
    "Exp": "overflows fp16 above 11.1",
    "Softmax": "exp plus a row sum (the attention accumulation)",
    "LogSoftmax": "exp plus a row sum",
    "Erf": "1 + erf(x) cancels in the GELU tail (x < -2); elementwise, so fp32 is cheap",
    "Range": "positions above 2048 are not exact in fp16 (above 256 in bf16)",
    "Cos": "arguments are positions times frequencies; a large angle keeps ~3 digits in fp16",
    "Sin": "arguments are positions times frequencies; a large angle keeps ~3 digits in fp16",
}

FOLLOW_FP32_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Sqrt", "Reciprocal", "Max", "Min", "Where", "Clip",
    "Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Gelu", "Erf",
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Concat", "Slice", "Gather", "Expand",
    "Identity", "Split", "Tile", "Pad",
})

# The runtime a conversion plans kernels for (`convert_precision(kernels=...)`):
#   "onnxruntime": ORT's CPU provider, asked node by node (kernels.py);
#   "infc-cpu": infc's NumPy runtime, whose exact low-precision ops are the ones in INFC_CPU_LOW_OPS;
#     every other op is emulated (fp32 between Casts): what an fp32-accumulating GPU kernel computes,
#     and the only fast path on a CPU (NumPy has no bf16 arithmetic and no fp16 BLAS);
#   "all": whatever the operator schema allows (the pure low-precision graph, for GPUs).
KERNEL_SETS = ("onnxruntime", "infc-cpu", "all")
_DATA_MOVEMENT = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Concat", "Slice", "Gather",
                            "GatherElements", "GatherND", "Expand", "Identity", "Split", "Tile", "Where",
                            "DepthToSpace", "SpaceToDepth", "Cast"})
INFC_CPU_LOW_OPS = {onnx.TensorProto.FLOAT16: _DATA_MOVEMENT, onnx.TensorProto.BFLOAT16: frozenset({"Cast"})}
# Ops of infc's runtime that read a low-precision value without computing in it (Shape's T, Cast's T1).
INFC_CPU_READERS = frozenset({"Shape", "Size", "Cast", "CastLike"})

# Nodes whose float output type is set by an attribute rather than by an input: how to retype them.
ATTRIBUTE_TYPED_OPS = {"Cast": "to", "ConstantOfShape": "value"}


def fits(values: np.ndarray, dtype: np.dtype) -> str | None:
    """None when `values` survive conversion to `dtype`, else why not (the consumer then stays fp32)."""
    if values.size == 0 or values.dtype.kind != "f":
        return None
    finite = np.isfinite(values)
    largest = float(np.abs(values[finite]).max()) if finite.any() else 0.0
    if exceeds(values, dtype):
        return f"a constant input overflows {dtype.name}"
    if largest > 0 and not np.any(values[finite].astype(dtype)):
        return f"a constant input underflows to zero in {dtype.name}"
    return None


def largest_finite(dtype: np.dtype) -> float:
    return float(ml_dtypes.finfo(dtype).max)


def exceeds(values: np.ndarray, dtype: np.dtype) -> bool:
    """Finite `values` past `dtype`'s range (float32's lowest as a mask fill): cast, they become inf."""
    if values.size == 0 or values.dtype.kind != "f":
        return False
    finite = np.abs(values[np.isfinite(values)])
    return finite.size > 0 and float(finite.max()) > largest_finite(dtype)


def retyped_attribute_node(node: onnx.NodeProto, low: int) -> onnx.NodeProto:
    """A copy of a Cast(to=FLOAT) / ConstantOfShape(value=float) node that produces `low` instead."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    for attr in copy.attribute:
        if attr.name == "to" and attr.i == onnx.TensorProto.FLOAT:
            attr.i = low
        if attr.name == "value" and attr.t.data_type == onnx.TensorProto.FLOAT:
            value = onnx.numpy_helper.to_array(attr.t).astype(NUMPY_DTYPES[low])
            attr.t.CopyFrom(onnx.numpy_helper.from_array(value, attr.t.name))
    return copy
