"""Row-quantized GEMMs (runtime/row_quantized_gemm.py): each row of x quantized as onnxruntime's
DynamicQuantizeLinear quantizes a tensor, an exact integer product, the file's epilogue; the same
bits for a row alone or in any batch, from onnxruntime's MatMulInteger or the float32 blocks, with
compiled kernels on or off."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from infc.compiler.runtime import jit
from infc.compiler.runtime.row_quantized_gemm import RowQuantizedWeight, quantize_rows

CODES = {"int8": (np.int8, -128, 128), "uint8": (np.uint8, 0, 256)}


def weight(kind: str, k: int, n: int, seed: int = 0) -> tuple[RowQuantizedWeight, np.ndarray, np.ndarray, np.ndarray]:
    dtype, low, high = CODES[kind]
    rng = np.random.default_rng(seed)
    codes = rng.integers(low, high, (k, n)).astype(dtype)
    zero = (np.zeros((1, n), dtype) if kind == "int8" else rng.integers(100, 156, (1, n)).astype(dtype))
    scale = (rng.random((1, n)) * 0.02 + 1e-3).astype(np.float32)
    return RowQuantizedWeight(codes, scale, zero), codes, scale, zero


def reference(x: np.ndarray, codes, scale, zero) -> np.ndarray:
    """The module docstring's formula with int64 sums."""
    q, row_scale, row_zero = quantize_rows(x)
    exact = (q.astype(np.int64) - row_zero[:, None]) @ (codes.astype(np.int64) - zero.astype(np.int64))
    return exact.astype(np.float32) * (row_scale[:, None] * scale.reshape(1, -1))


def activations(rows: int, k: int, seed: int = 1) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((rows, k)).astype(np.float32) * 3
    if rows > 2:
        x[1] = 0.0  # scale 1, codes 0
        x[2] = np.abs(x[2])  # no negatives: zero point 0
    return x


@pytest.mark.parametrize("kind", sorted(CODES))
@pytest.mark.parametrize("k, n", [(576, 96), (67, 33), (1536, 40)])
def test_the_product_is_the_formula_and_each_row_is_the_same_alone(kind, k, n):
    w, codes, scale, zero = weight(kind, k, n)
    x = activations(23, k)
    y = w.product(x)
    np.testing.assert_array_equal(y, reference(x, codes, scale, zero))
    for row in (0, 1, 2, 22):
        np.testing.assert_array_equal(w.product(x[row:row + 1]), y[row:row + 1])
    np.testing.assert_array_equal(y[1], 0.0)


def only(path: str, w: RowQuantizedWeight) -> RowQuantizedWeight:
    """A copy of the weight whose integer sums come from one path: "vnni" tiles (decode rows),
    onnxruntime's "session", or the float32 "blocks"."""
    copy = RowQuantizedWeight(w.codes, w.scale.reshape(1, -1), w.zero.reshape(1, -1))
    if path != "vnni":
        copy._vnni = False
    if path != "session":
        copy._session = False
    return copy


@pytest.mark.parametrize("kind", sorted(CODES))
@pytest.mark.parametrize("rows", [1, 9, 40])
def test_the_vnni_tiles_onnxruntime_and_the_float32_blocks_give_the_same_integers(kind, rows):
    from infc.compiler.runtime import integer_gemm, vnni_gemm

    w, codes_w, scale, zero = weight(kind, 1100, 72, seed=3)
    codes = np.random.default_rng(4).integers(0, 256, (rows, 1100)).astype(np.uint8)
    codes[0] = 255  # the largest sums: 16-bit pair sums would saturate here
    centered = codes_w.astype(np.int64) - zero.astype(np.int64)
    expected = codes.astype(np.int64) @ centered
    x = activations(rows, 1100, seed=8)
    reference = only("blocks", w).product(x)
    for path, available in (("blocks", True), ("session", integer_gemm.is_exact()),
                            ("vnni", vnni_gemm.has_vnni() and jit.enabled() and rows <= vnni_gemm.MAX_ROWS)):
        if not available:
            continue
        np.testing.assert_array_equal(np.asarray(only(path, w).integer_product(codes), np.int64), expected, err_msg=path)
        np.testing.assert_array_equal(only(path, w).product(x), reference, err_msg=path)


@pytest.mark.parametrize("kind", sorted(CODES))
def test_compiled_and_numpy_paths_give_the_same_bits(kind):
    w, *_ = weight(kind, 300, 50, seed=5)
    x = activations(11, 300, seed=6)
    y = w.product(x)
    with jit.disabled():
        np.testing.assert_array_equal(w.product(x), y)


def test_each_row_is_quantized_as_dynamic_quantize_linear_quantizes_it():
    graph = helper.make_graph([helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info(name, dtype, None)
                               for name, dtype in (("q", TensorProto.UINT8), ("s", TensorProto.FLOAT), ("z", TensorProto.UINT8))])
    session = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
                                   .SerializeToString(), providers=["CPUExecutionProvider"])
    x = activations(16, 200, seed=7)
    x[5] += 4.0  # all positive
    x[6] -= 4.0  # all negative
    codes, scale, zero = quantize_rows(x)
    for row in range(x.shape[0]):
        q, s, z = session.run(None, {"x": x[row]})
        if not x[row].any():
            continue  # onnxruntime's scale 0 there; ours 1 (the same codes and sums)
        assert s == scale[row] and int(z) == zero[row]
        # onnxruntime multiplies by the reciprocal of the scale: a code may differ by one on a half
        assert np.abs(q.astype(int) - codes[row]).max() <= 1 and (q != codes[row]).mean() < 0.01
