"""Cast, CastLike and BitCast, including bfloat16, float8 and sub-byte targets (via ml_dtypes)."""

from __future__ import annotations

import numpy as np

from .common import is_exotic, np_dtype
from .jit_half import F16, F32, float16_to_float32, float32_to_float16, round_to_low

# float8 targets clamp to their finite range when `saturate` is set (the default).
_SATURATING = {"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"}


_PLAIN_KINDS = "biuf"  # bool, integers and IEEE floats: a plain astype


def cast_array(x: np.ndarray, dtype: np.dtype, saturate: bool = True) -> np.ndarray:
    if x.dtype == dtype:
        return x
    if x.dtype == F32 and dtype == F16:  # NumPy converts these one value at a time (jit_half.py)
        return float32_to_float16(x)
    if x.dtype == F16 and dtype == F32:
        return float16_to_float32(x)
    if x.dtype.kind in _PLAIN_KINDS and dtype.kind in _PLAIN_KINDS:
        # a float too large for the target becomes inf (ONNX's Cast semantics); NumPy's warning is
        # filtered for the kernels (kernels/__init__.py), where np.errstate would cost ~7 us a call
        return x.astype(dtype)
    if dtype == object:
        return _to_strings(x)
    if x.dtype == object:
        return _from_strings(x, dtype)
    if dtype.name in _SATURATING and saturate:
        import ml_dtypes  # noqa: PLC0415 - only float8 casts get here

        info = ml_dtypes.finfo(dtype)
        source = x.astype(np.float32) if is_exotic(x.dtype) else x
        return np.clip(source, float(info.min), float(info.max)).astype(dtype)
    if is_exotic(x.dtype) and is_exotic(dtype):
        return x.astype(np.float32).astype(dtype)
    return x.astype(dtype)


def _to_strings(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "f":
        flat = [_float_text(v) for v in x.astype(np.float32).ravel().tolist()]
        return np.array(flat, dtype=object).reshape(x.shape)
    return x.astype(np.str_).astype(object)


def _float_text(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "INF" if value > 0 else "-INF"
    return np.format_float_positional(np.float32(value), trim="-") if abs(value) >= 1e-4 or value == 0 else \
        np.format_float_scientific(np.float32(value), trim="-")


def _from_strings(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    flat = [s.decode() if isinstance(s, bytes) else str(s) for s in x.ravel().tolist()]
    if dtype == bool:
        return np.array([s.strip().lower() not in ("0", "false", "") for s in flat], dtype=bool).reshape(x.shape)
    if dtype.kind in "iu":
        return np.array([int(float(s)) for s in flat], dtype=dtype).reshape(x.shape)
    return np.array(flat, dtype=np.float64).astype(dtype).reshape(x.shape) if flat else np.zeros(x.shape, dtype)


def cast(inputs, attrs, ctx):
    return [cast_array(inputs[0], np_dtype(attrs["to"]), bool(attrs.get("saturate", 1)))]


def cast_like(inputs, attrs, ctx):
    return [cast_array(inputs[0], inputs[1].dtype, bool(attrs.get("saturate", 1)))]


def round_to(inputs, attrs, ctx):
    """infc.cpu RoundTo: float32 in, float32 out, every value rounded to the low type `to` (what a Cast
    to it and a Cast back give; runtime/cast_fold.py makes these of such pairs). In place when the
    executor donates the dying input."""
    x = inputs[0]
    low = np_dtype(attrs["to"])
    if x.dtype != F32:  # not float32 after all (a float64 value cast down): the two casts, whose second is to float32
        return [x.astype(low).astype(F32)]
    return [round_to_low(x, low.name, ctx.out[0] if ctx.out else None)]


round_to.accepts_out = True


def bit_cast(inputs, attrs, ctx):
    x = inputs[0] if inputs[0].flags.c_contiguous else inputs[0].copy()
    dtype = np_dtype(attrs["to"])
    return [x.reshape(-1).view(dtype).reshape(x.shape)]


KERNELS = {
    ("", "Cast"): cast,
    ("", "CastLike"): cast_like,
    ("", "BitCast"): bit_cast,
    ("infc.cpu", "RoundTo"): round_to,
}
