"""Exact integer GEMMs of 8-bit operands (MatMulInteger, QLinearMatMul, quantize_dynamic decoders).

Integer sums are exact, so any kernel that computes them gives the same numbers. Two here:
`exact_integer_matmul`, float32 BLAS over blocks of K short enough that every partial sum is an
exactly representable integer; and onnxruntime's MatMulInteger on a constant weight
(`weight_session`: VNNI / AMX on x86, about 5-20x a float32 GEMM of the same shape on a Sapphire
Rapids), wherever it is exact: it is not on x86 without VNNI, whose uint8 x int8 kernel adds products in saturating 16-bit pairs:
`is_exact` checks once a process, on extreme codes. A uint8 weight goes in as int8 (`as_int8`).
For a few rows runtime/vnni_gemm.py streams the weight once (onnxruntime has no GEMV).
"""

from __future__ import annotations

import functools

import numpy as np

from .gemm_impls import product_into

_INT32_MAX = (1 << 31) - 1
EXACT_FLOAT32 = float(1 << 24)  # integers up to this magnitude are exact in float32


def exact_integer_matmul(a: np.ndarray, b: np.ndarray, b_largest: float | None = None) -> np.ndarray:
    """a @ b (float64) for integer-valued float32 operands, exactly, in float32 BLAS: the K axis goes
    in chunks short enough that no partial sum of a chunk can pass 2^24 (512 values of int8 x
    uint8 products), each chunk's float32 product is exact, and the chunks add up in float64
    (exact far past any 8-bit problem). NumPy's integer matmul has no BLAS path, and float64
    GEMMs run at half float32's speed."""
    k = a.shape[-1]
    if b.ndim == 2 and a.ndim > 2:  # one 2-D GEMM: NumPy's stacked matmul is slower even for one item
        return exact_integer_matmul(a.reshape(-1, k), b, b_largest).reshape(a.shape[:-1] + (b.shape[1],))
    b_largest = float(np.abs(b).max(initial=0.0)) if b_largest is None else b_largest
    largest = float(np.abs(a).max(initial=0.0)) * b_largest
    chunk = k if largest == 0.0 else int(EXACT_FLOAT32 // largest)
    if chunk < 1:  # not 8-bit data: float64 holds these sums
        return np.matmul(a.astype(np.float64), b.astype(np.float64))
    product = product_into if a.ndim == 2 and b.ndim == 2 else np.matmul  # 2-D: shared with the helper thread
    if chunk >= k:
        return product(a, b).astype(np.float64)
    total = None
    for start in range(0, k, chunk):
        part = product(a[..., start:start + chunk], b[..., start:start + chunk, :])
        total = part.astype(np.float64) if total is None else total + part
    return total


def fits_int32(k: int, centered_max: int, headroom: int = 1) -> bool:
    """Every sum of K products of uint8 activations and weights within centered_max of their zero
    points fits an int32 accumulator `headroom` times over."""
    return headroom * 255 * centered_max * k <= _INT32_MAX


def as_int8(codes: np.ndarray, zero: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """8-bit codes and zero points as int8 with the same differences (uint8: both minus 128): the
    uint8 x int8 products of the fast kernels."""
    if codes.dtype == np.int8:
        return codes, zero
    return tuple((v.astype(np.int16) - 128).astype(np.int8) for v in (codes, zero))


def weight_session(codes: np.ndarray, zero: np.ndarray | None):
    """A session y = MatMulInteger(a, W, a_zero, W_zero) with W = `codes` [K, N] (int8 or uint8)
    handed as an array (not copied into the model's bytes) and `zero` its zero points (scalar or
    per column, the codes' type; None: 0); inputs "a" (uint8, any rank) and "a_zero" (uint8 scalar).
    None when onnxruntime (or onnx) is missing or cannot run it."""
    try:
        import onnxruntime as ort  # noqa: PLC0415 - only plans with integer GEMMs
        from onnx import TensorProto, helper, numpy_helper  # noqa: PLC0415
    except ImportError:
        return None
    from .vendor_op import external_stub  # noqa: PLC0415

    weight, zero = as_int8(codes, np.zeros((), codes.dtype) if zero is None else np.asarray(zero).reshape(-1))
    weight = np.ascontiguousarray(weight)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w", "a_zero", "w_zero"], ["y"])], "integer_gemm",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, None),
         helper.make_tensor_value_info("a_zero", TensorProto.UINT8, [])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [external_stub("w", weight), numpy_helper.from_array(np.ascontiguousarray(zero), "w_zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_external_initializers(["w"], [ort.OrtValue.ortvalue_from_numpy(weight)])
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - an onnxruntime without this kernel: the caller's float path serves
        return None
    session.weight = weight  # onnxruntime reads the handed array: it lives as long as the session
    return session


def run(session, a: np.ndarray, a_zero=0) -> np.ndarray:
    """The session's int32 sums for uint8 `a`, its zero point `a_zero` (a scalar)."""
    return session.run(None, {"a": a, "a_zero": np.asarray(a_zero, np.uint8).reshape(())})[0]


@functools.cache
def is_exact() -> bool:
    """onnxruntime's MatMulInteger gives the exact integers on this CPU (saturating 16-bit pair sums
    would show on extreme codes), for int8 and uint8 weights at one and many rows; once a process."""
    rng = np.random.default_rng(0)
    k, n = 256, 48
    for dtype, low, high in ((np.int8, -128, 127), (np.uint8, 0, 255)):
        codes = rng.integers(low, high + 1, (k, n)).astype(dtype)
        codes[:, :8], codes[:, 8:16] = high, low  # pairs of 255 * 127 overflow int16
        zero = np.zeros(n, dtype) if dtype == np.int8 else np.full(n, 7, dtype)
        session = weight_session(codes, zero)
        if session is None:
            return False
        centered = codes.astype(np.int64) - zero.astype(np.int64)
        for rows, a_zero in ((1, 0), (5, 3), (64, 0)):
            a = rng.integers(0, 256, (rows, k)).astype(np.uint8)
            a[0] = 255
            if not np.array_equal(run(session, a, a_zero), (a.astype(np.int64) - a_zero) @ centered):
                return False
    return True
