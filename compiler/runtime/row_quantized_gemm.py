"""Dynamically quantized GEMMs of a decoder plan (onnxruntime's quantize_dynamic: MatMulInteger on
DynamicQuantizeLinear's codes), batch-invariant and at integer speed.

    x [M, K] float32 ─► per row: scale, zero point, uint8 codes (DynamicQuantizeLinear's formula)
    acc = codes @ (W - W_zero)  -  zero[m] * sum_k (W - W_zero)[k, n]      exact integers
    y = float32(acc) * (scale[m] * W_scale[n])                              the file's own epilogue

The file quantizes x with one scale over the whole tensor: over a step's whole batch of tokens, so a
token's logits would depend on the tokens beside it. Here each row gets its own scale and zero
point, computed from that row alone. The integer sums are exact, so they are the same whatever
kernel computes them, in whatever order: onnxruntime's MatMulInteger (VNNI / AMX: 5-20x the float32
GEMM on prefill rows of a Sapphire Rapids) serves every row count, and a row's result is the same
bits alone or in any batch, prefill or decode. Where onnxruntime's kernel is not exact (x86 without
VNNI multiplies uint8 by int8 in saturating 16-bit pairs: checked once a process, `_session_is_exact`)
or not there, the same integers come from float32 GEMMs over blocks of K short enough that every
partial sum is an exactly representable integer. The quantization and the epilogue are one compiled
loop each (runtime/jit.py), or NumPy computing the same IEEE operations in the same order.

An activation code flips where x / scale lies within a rounding of a half, so a plan's logits there
differ from onnxruntime's on the file by one code's worth, as the file's own quantization of x
differs between batches.
"""

from __future__ import annotations

import functools

import numpy as np

from .jit import jit, prange

ROW_QUANTIZED = "row_quantized"  # the BatchInvariant step's attribute: activations quantized per row
_U8_TOP = 255
_FLOAT32_EXACT = 1 << 24  # integers up to this are exact in float32
_INT32_MAX = (1 << 31) - 1
_STRICT: set[str] = set()  # no reassociation, no contraction: the NumPy form's operations exactly
_ROUNDING = 1.5 * 2.0 ** 23  # v + this - this rounds float32 v (|v| < 2^22) half to even
SPREAD_MIN_ELEMENTS = 1 << 15  # a loop over this many values is spread over two threads


@jit(fastmath=_STRICT)
def _quantize_rows_loop(x, low, high, codes, scale, zero):
    top, half_even = np.float32(_U8_TOP), np.float32(_ROUNDING)
    for m in prange(x.shape[0]):
        s = (high[m] - low[m]) / top
        if s == 0:
            s = np.float32(1.0)
        z = (-low[m] / s + half_even) - half_even
        z = min(max(z, np.float32(0.0)), top)
        for k in range(x.shape[1]):
            c = ((x[m, k] / s + half_even) - half_even) + z  # |x / s| <= 255: exact round half to even
            c = c if c > 0 else np.float32(0.0)
            c = c if c < top else top
            codes[m, k] = np.uint8(c)
        scale[m], zero[m] = s, np.int32(z)


def _loop(kernel, rows: int, elements: int):
    """The kernel's build: spread over numba's threads for prefill-sized calls."""
    spread = kernel.get_parallel() if rows > 1 and elements >= SPREAD_MIN_ELEMENTS else None
    return spread or kernel.get()


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x [M, K] float32 -> (codes uint8 [M, K], scale float32 [M], zero point int32 [M]): each row
    as DynamicQuantizeLinear quantizes a whole tensor (its range widened to hold 0; scale =
    range / 255; zero point = round(-min / scale); codes = saturate(round(x / scale) + zero), rounding
    half to even). A row of zeros gets scale 1 and codes 0."""
    x = np.ascontiguousarray(x, np.float32)
    low, high = x.min(axis=1, initial=0.0), x.max(axis=1, initial=0.0)  # NumPy's reductions are vectorized
    compiled = _loop(_quantize_rows_loop, x.shape[0], x.size)
    if compiled is not None:
        codes, scale, zero = np.empty(x.shape, np.uint8), np.empty(x.shape[0], np.float32), np.empty(x.shape[0], np.int32)
        compiled(x, low, high, codes, scale, zero)
        return codes, scale, zero
    scale = (high - low) / np.float32(_U8_TOP)
    scale[scale == 0] = 1.0
    zero = np.clip(np.rint(-low / scale), 0, _U8_TOP).astype(np.float32)
    codes = np.rint(x / scale[:, None])
    codes += zero[:, None]
    np.clip(codes, 0, _U8_TOP, out=codes)
    return codes.astype(np.uint8), scale, zero.astype(np.int32)


@jit(fastmath=_STRICT)
def _epilogue_loop(acc, zero, column_sums, scale, w_scale, out):
    for m in prange(acc.shape[0]):
        z, s = zero[m], scale[m]
        for n in range(acc.shape[1]):
            out[m, n] = np.float32(acc[m, n] - z * column_sums[n]) * (s * w_scale[n])


def _epilogue(acc: np.ndarray, zero: np.ndarray, column_sums: np.ndarray, scale: np.ndarray,
              w_scale: np.ndarray) -> np.ndarray:
    """float32(acc - zero[m] * column_sums[n]) * (scale[m] * w_scale[n]), the correction exact (in
    acc's integers: int32 where RowQuantizedWeight found it cannot overflow, else int64)."""
    compiled = _loop(_epilogue_loop, acc.shape[0], acc.size)
    if compiled is not None:
        out = np.empty(acc.shape, np.float32)
        compiled(acc, zero.astype(acc.dtype), column_sums.astype(acc.dtype), scale, w_scale, out)
        return out
    exact = acc.astype(np.int64) - zero.astype(np.int64)[:, None] * column_sums[None, :]
    return exact.astype(np.float32) * (scale[:, None] * w_scale[None, :])


class RowQuantizedWeight:
    """W [K, N] 8-bit codes with a scale and zero point per column, ready for row-quantized products:
    the column sums of W - W_zero (the rows' zero-point correction) and, made on first use,
    onnxruntime's session over the codes or the float32 blocks of the exact fallback."""

    def __init__(self, codes: np.ndarray, scale: np.ndarray, zero: np.ndarray):
        self.codes = codes
        self.zero = zero.reshape(-1)
        self.scale = np.ascontiguousarray(scale.reshape(-1), np.float32)
        self.centered_max = int(np.abs(codes.astype(np.int16) - self.zero.astype(np.int16)).max(initial=0))
        self.column_sums = codes.astype(np.int64).sum(axis=0) - codes.shape[0] * self.zero.astype(np.int64)
        self._session = None  # False once known not to serve
        self._blocks = None

    def product(self, x: np.ndarray) -> np.ndarray:
        """x [M, K] float32 @ W, x quantized per row (see the module docstring), as float32 [M, N]."""
        codes, scale, zero = quantize_rows(x)
        return _epilogue(self.integer_product(codes), zero, self.column_sums, scale, self.scale)

    def integer_product(self, codes: np.ndarray) -> np.ndarray:
        """codes [M, K] uint8 @ (W - W_zero), exactly (int32 from onnxruntime, else int64)."""
        if self._session is None:
            # its int32 accumulators, and the epilogue's correction of them, cannot overflow
            fits = 2 * _U8_TOP * self.centered_max * self.codes.shape[0] <= _INT32_MAX
            self._session = (fits and _session_is_exact() and _matmul_integer_session(self.codes, self.zero)) or False
        if self._session:
            return self._session.run(None, {"a": codes})[0]
        return self.blocked_product(codes)

    def blocked_product(self, codes: np.ndarray) -> np.ndarray:
        """The exact integers from float32 GEMMs over K blocks whose partial sums stay below 2^24."""
        k = self.codes.shape[0]
        step = max(1, _FLOAT32_EXACT // (_U8_TOP * max(1, self.centered_max)))
        if self._blocks is None:
            centered = self.codes.astype(np.float32) - self.zero.astype(np.float32)
            self._blocks = [np.ascontiguousarray(centered[k0:k0 + step]) for k0 in range(0, k, step)]
        a = codes.astype(np.float32)
        total = np.zeros((codes.shape[0], self.codes.shape[1]), np.int64)
        for index, block in enumerate(self._blocks):
            total += (a[:, index * step:index * step + block.shape[0]] @ block).astype(np.int64)
        return total


def _matmul_integer_session(w_codes: np.ndarray, w_zero: np.ndarray):
    """onnxruntime's MatMulInteger(a uint8 [M, K], W codes, a's zero point 0, W's), W handed as an
    array (not copied into the model's bytes); None when onnxruntime cannot run it."""
    try:
        import onnxruntime as ort  # noqa: PLC0415 - plans with row-quantized steps only
        from onnx import TensorProto, helper, numpy_helper  # noqa: PLC0415
    except ImportError:
        return None
    from .vendor_op import external_stub  # noqa: PLC0415

    k, n = w_codes.shape
    if w_codes.dtype == np.uint8:  # the same differences as int8 codes and zero points: uint8 x int8 is the fast kernel
        w_codes, w_zero = ((v.astype(np.int16) - 128).astype(np.int8) for v in (w_codes, w_zero))
    weight = np.ascontiguousarray(w_codes)
    inputs, initializers = ["a", "w"], [external_stub("w", weight)]
    if w_zero.any():
        inputs += ["", "w_zero"]
        initializers.append(numpy_helper.from_array(np.ascontiguousarray(w_zero), "w_zero"))
    graph = helper.make_graph([helper.make_node("MatMulInteger", inputs, ["y"])], "row_quantized",
                              [helper.make_tensor_value_info("a", TensorProto.UINT8, [None, k])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [None, n])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_external_initializers(["w"], [ort.OrtValue.ortvalue_from_numpy(weight)])
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - an onnxruntime without this kernel: the float32 blocks serve
        return None
    session.weight = weight  # onnxruntime reads the handed array: it lives as long as the session
    return session


@functools.cache
def _session_is_exact() -> bool:
    """onnxruntime's MatMulInteger gives the exact integers on this CPU (saturating 16-bit pair sums
    would show on extreme codes), for int8 and uint8 weights at one and many rows; once a process."""
    rng = np.random.default_rng(0)
    k, n = 256, 48
    for dtype, low, high in ((np.int8, -128, 127), (np.uint8, 0, 255)):
        codes = rng.integers(low, high + 1, (k, n)).astype(dtype)
        codes[:, :8], codes[:, 8:16] = high, low  # pairs of 255 * 127 overflow int16
        zero = np.zeros(n, dtype) if dtype == np.int8 else np.full(n, 7, dtype)
        session = _matmul_integer_session(codes, zero)
        if session is None:
            return False
        centered = codes.astype(np.int64) - zero.astype(np.int64)
        for rows in (1, 5, 64):
            a = rng.integers(0, _U8_TOP + 1, (rows, k)).astype(np.uint8)
            a[0] = _U8_TOP
            if not np.array_equal(session.run(None, {"a": a})[0], a.astype(np.int64) @ centered):
                return False
    return True
