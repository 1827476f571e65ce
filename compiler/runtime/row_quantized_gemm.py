"""Dynamically quantized GEMMs of a decoder plan (onnxruntime's quantize_dynamic: MatMulInteger on
DynamicQuantizeLinear's codes), batch-invariant and at integer speed.

    x [M, K] float32 ─► per row: scale, zero point, uint8 codes (DynamicQuantizeLinear's formula)
    acc = codes @ (W - W_zero)  -  zero[m] * sum_k (W - W_zero)[k, n]      exact integers
    y = float32(acc) * (scale[m] * W_scale[n])                              the file's own epilogue

The file quantizes x with one scale over the whole tensor: over a step's whole batch of tokens, so a
token's logits would depend on the tokens beside it. Here each row gets its own scale and zero
point, computed from that row alone. The integer sums are exact, so they are the same whatever
kernel computes them, in whatever order: onnxruntime's MatMulInteger (integer_gemm.py: VNNI /
AMX, 5-20x the float32 GEMM on prefill rows of a Sapphire Rapids) serves every row count, and a
row's result is the same bits alone or in any batch, prefill or decode. Where onnxruntime's kernel
is not exact or not there, the same integers come from float32 GEMMs over blocks of K short enough
that every partial sum is an exactly representable integer (integer_gemm.exact_integer_matmul).
The quantization and the epilogue are one compiled loop each (runtime/jit.py), or NumPy computing
the same IEEE operations in the same order.

An activation code flips where x / scale lies within a rounding of a half, so a plan's logits there
differ from onnxruntime's on the file by one code's worth, as the file's own quantization of x
differs between batches.
"""

from __future__ import annotations

import numpy as np

from . import integer_gemm, vnni_gemm
from .jit import jit, prange

ROW_QUANTIZED = "row_quantized"  # the BatchInvariant step's attribute: activations quantized per row
_U8_TOP = 255
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
        compiled(acc, zero.astype(acc.dtype, copy=False), column_sums.astype(acc.dtype, copy=False), scale, w_scale, out)
        return out
    exact = acc.astype(np.int64) - zero.astype(np.int64)[:, None] * column_sums[None, :]
    return exact.astype(np.float32) * (scale[:, None] * w_scale[None, :])


class RowQuantizedWeight:
    """W [K, N] 8-bit codes with a scale and zero point per column, ready for row-quantized products:
    the column sums of W - W_zero (the rows' zero-point correction) and, made on first use,
    onnxruntime's session over the codes or the centered float32 weight of the exact fallback."""

    def __init__(self, codes: np.ndarray, scale: np.ndarray, zero: np.ndarray):
        self.codes = codes
        self.zero = zero.reshape(-1)
        self.scale = np.ascontiguousarray(scale.reshape(-1), np.float32)
        self.centered_max = int(np.abs(codes.astype(np.int16) - self.zero.astype(np.int16)).max(initial=0))
        self.column_sums = codes.astype(np.int64).sum(axis=0) - codes.shape[0] * self.zero.astype(np.int64)
        self._sums_as: dict = {}  # the column sums in each accumulator type the epilogue meets (made once, not per call)
        self._session = None  # False once known not to serve
        self._vnni = None  # (panels, int8 zero points or None where all are 0), or False
        self._centered = None

    def prepare(self) -> None:
        """Makes onnxruntime's session now (a fraction of a millisecond to tens of them a weight): at
        the first call, which the runner's warm-up makes, not at the first prompt longer than the
        decode rows (SmolLM2's 121 sessions added a second to the first request's TTFT)."""
        if self._session is None:
            # its int32 accumulators, and the epilogue's correction of them, cannot overflow
            fits = integer_gemm.fits_int32(self.codes.shape[0], self.centered_max, headroom=2)
            self._session = (fits and integer_gemm.is_exact() and integer_gemm.weight_session(self.codes, self.zero)) or False

    def _vnni_product(self, codes: np.ndarray) -> np.ndarray | None:
        """codes @ (W' - z') with W', z' the int8 form of W and its zero points (integer_gemm.as_int8):
        the VNNI tiles' codes @ W' less each row's sum of codes times z'; None without VNNI."""
        if self._vnni is None:
            usable = vnni_gemm.has_vnni() and integer_gemm.fits_int32(self.codes.shape[0], 128, headroom=2)
            if usable:
                weight, zero = integer_gemm.as_int8(self.codes, self.zero)
                # zero points all 0 (int8 codes, as quantize_dynamic writes them): no correction, None
                self._vnni = (vnni_gemm.pack_vnni(weight), zero.astype(np.int64) if zero.any() else None)
            else:
                self._vnni = False
        if not self._vnni:
            return None
        panels, zero = self._vnni
        raw = vnni_gemm.vnni_product(codes, panels, self.codes.shape[1])
        if raw is None or zero is None:
            return raw
        return raw - codes.sum(axis=1, dtype=np.int64)[:, None] * zero[None, :]

    def product(self, x: np.ndarray) -> np.ndarray:
        """x [M, K] float32 @ W, x quantized per row (see the module docstring), as float32 [M, N]."""
        codes, scale, zero = quantize_rows(x)
        acc = self.integer_product(codes)
        sums = self._sums_as.get(acc.dtype)
        if sums is None:
            sums = self._sums_as[acc.dtype] = self.column_sums.astype(acc.dtype)
        return _epilogue(acc, zero, sums, scale, self.scale)

    def integer_product(self, codes: np.ndarray) -> np.ndarray:
        """codes [M, K] uint8 @ (W - W_zero), exactly: for decode rows from the VNNI tiles
        (vnni_gemm.py), else int32 from onnxruntime where exact (integer_gemm.py), else float64
        from float32 blocks (integer_gemm.exact_integer_matmul)."""
        if codes.shape[0] <= vnni_gemm.MAX_ROWS:
            rows = self._vnni_product(codes)
            if rows is not None:
                return rows
        self.prepare()
        if self._session:
            return integer_gemm.run(self._session, codes)
        if self._centered is None:
            self._centered = self.codes.astype(np.float32) - self.zero.astype(np.float32)
        return integer_gemm.exact_integer_matmul(codes.astype(np.float32), self._centered, float(self.centered_max)).astype(np.int64)
