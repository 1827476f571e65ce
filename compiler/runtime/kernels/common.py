"""What the kernel families share: the kernel context, ONNX dtype codes, attribute and axis helpers.

A kernel is `kernel(inputs, attrs, ctx) -> list[np.ndarray]`: `inputs` holds arrays (None for an
omitted optional input), `attrs` the step's JSON attributes with tensors already decoded to arrays,
`ctx` the model's default-domain opset, preallocated output buffers (None where unknown) and a
per-step memo for shape-dependent plans.
Kernels never write into their inputs: weights and feeds are shared between runs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

# parallel_for: the kernels' way to share a loop with a second core
from ..gemm_impls import PARALLEL_MIN_BYTES, parallel_for


@dataclass
class KernelContext:
    opset: int
    out: list = field(default_factory=list)
    memo: dict = field(default_factory=dict)  # per-step scratch a kernel may keep between runs (plans by shape)
    # the step's `bf16_tiles`: its operands hold bf16 values and the build measured its convolution
    # faster on AMX-BF16 tiles (kernels/amx_conv.py; tune_vendor.py)
    bf16_tiles: bool = False

    def out_buffer(self, index: int = 0) -> np.ndarray | None:
        return self.out[index] if index < len(self.out) else None


# TensorProto.DataType codes -> dtype names; the ml_dtypes names load lazily (only models that use
# bfloat16, float8 or sub-byte types need that package).
ONNX_DTYPE_NAMES = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 8: "object",
    9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 14: "complex64", 15: "complex128",
    16: "bfloat16", 17: "float8_e4m3fn", 18: "float8_e4m3fnuz", 19: "float8_e5m2", 20: "float8_e5m2fnuz",
    21: "uint4", 22: "int4", 23: "float4_e2m1fn", 24: "float8_e8m0fnu", 25: "uint2", 26: "int2",
}


@functools.lru_cache(maxsize=None)
def np_dtype(code_or_name) -> np.dtype:
    name = ONNX_DTYPE_NAMES[int(code_or_name)] if isinstance(code_or_name, (int, np.integer)) else str(code_or_name)
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # noqa: PLC0415 - optional, for exotic dtypes only

        return np.dtype(getattr(ml_dtypes, name))


def is_exotic(dtype: np.dtype) -> bool:
    """bfloat16, float8 and sub-byte types (ml_dtypes, kind "V"): NumPy has no arithmetic for them,
    compute in float32."""
    return dtype.kind == "V"


def tensor_from_json(value: dict) -> np.ndarray:
    spec = value["tensor"]
    dtype = np_dtype(spec["dtype"])
    data = spec["data"]
    if dtype == object:
        return np.array(data, dtype=object).reshape(spec["shape"])
    if is_exotic(dtype):
        return np.array(data, dtype=np.float32).astype(dtype).reshape(spec["shape"])
    return np.array(data, dtype=dtype).reshape(spec["shape"])


def decode_attrs(attrs: dict) -> dict:
    return {k: _decode(v) for k, v in attrs.items()}


def _decode(value):
    if isinstance(value, dict) and "tensor" in value:
        return tensor_from_json(value)
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def arg(inputs: list, index: int) -> np.ndarray | None:
    """An optional input: None when omitted or past the end."""
    return inputs[index] if index < len(inputs) else None


def ints(value) -> list[int]:
    if isinstance(value, np.ndarray) and value.dtype.kind in "iu":
        return value.reshape(-1).tolist()
    return [int(v) for v in np.asarray(value).ravel()]


def broadcast_shape(a: tuple, b: tuple) -> tuple:
    """NumPy broadcasting of two shapes, in plain Python (np.broadcast_shapes costs microseconds)."""
    if len(a) < len(b):
        a = (1,) * (len(b) - len(a)) + tuple(a)
    elif len(b) < len(a):
        b = (1,) * (len(a) - len(b)) + tuple(b)
    shape = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            raise ValueError(f"shapes {a} and {b} do not broadcast")
        shape.append(y if x == 1 else x)
    return tuple(shape)


def norm_axis(axis: int, rank: int) -> int:
    axis = int(axis)
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def axes_from(inputs: list, attrs: dict, input_index: int, rank: int) -> list[int] | None:
    """Axes given as an input (newer opsets) or as the `axes` attribute (older); None when absent."""
    given = arg(inputs, input_index)
    if given is not None:
        return [norm_axis(a, rank) for a in ints(given)]
    if attrs.get("axes") is not None:
        return [norm_axis(a, rank) for a in attrs["axes"]]
    return None


try:  # the clip ufunc itself: one pass, without np.clip's Python wrapper (~2 us) or two passes of min/max
    from numpy._core.umath import clip as _clip_ufunc
except ImportError:  # pragma: no cover - NumPy 1.x
    _clip_ufunc = None


def clip_into(x: np.ndarray, low, high, out: np.ndarray) -> np.ndarray:
    """np.clip(x, low, high, out=out) in one pass; NaN stays NaN."""
    if _clip_ufunc is not None:
        return _clip_ufunc(x, low, high, out=out)
    return np.clip(x, low, high, out=out)


def to_compute(x: np.ndarray) -> np.ndarray:
    """Exotic float dtypes go to float32 for arithmetic; everything else stays as is."""
    return x.astype(np.float32) if x.dtype.kind == "V" else x


def over_planes(compiled, planes: np.ndarray, args: tuple, out: np.ndarray, nbytes: int) -> None:
    """compiled(planes, *args, out) over independent leading-axis planes (images x channels), split in
    two halves between the cores when there are two planes and `nbytes` is worth the hand-off."""
    count = planes.shape[0]
    if count < 2 or nbytes < PARALLEL_MIN_BYTES:
        compiled(planes, *args, out)
        return

    def half(index: int) -> None:
        lo, hi = count * index // 2, count * (index + 1) // 2
        compiled(planes[lo:hi], *args, out[lo:hi])

    parallel_for(2, half)
