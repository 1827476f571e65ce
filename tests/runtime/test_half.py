"""float16 models: ops compute in float32 and round once, as onnxruntime's CPU provider runs them
(kernels/half.py). NumPy's own float16 paths round intermediate results (LayerNorm's statistics,
Softmax's sums, Resize's weights) and are off by about one float16 ulp (5e-4); the widened kernels
agree with onnxruntime to far less."""

import numpy as np
import pytest

H = np.float16
MS = "com.microsoft"
ONE_ROUNDING = 1e-4  # well under one float16 ulp (4.9e-4 relative)


@pytest.fixture
def x(rng):
    return rng.standard_normal((2, 16, 96)).astype(H)


def test_layer_norm_keeps_float32_statistics(x, rng, single_node, ort_check):
    g, b = (rng.random(96) + 0.5).astype(H), (rng.standard_normal(96) * 0.1).astype(H)
    model = single_node("LayerNormalization", {"x": x}, [("y", H), ("mean", np.float32), ("inv_std", np.float32)],
                        {"axis": -1}, initializers={"g": g, "b": b})
    out = ort_check(model, {"x": x}, rtol=3e-4)  # a last-bit difference here and there
    assert out["y"].dtype == H and out["mean"].dtype == np.float32


def test_skip_layer_norm(x, rng, single_node, ort_check):
    g, b = (rng.random(96) + 0.5).astype(H), (rng.standard_normal(96) * 0.1).astype(H)
    skip = rng.standard_normal(x.shape).astype(H)
    model = single_node("SkipLayerNormalization", {"x": x, "skip": skip}, [("y", H)], initializers={"g": g, "b": b},
                        domain=MS)
    ort_check(model, {"x": x, "skip": skip}, rtol=4e-4)


def test_skip_layer_norm_sum_output_stays_float16(x, rng, graph_of, ort_check):
    """The skip sum (output 3) has the input type like the normalized output: it came out float32 and
    fed a float16 onnxruntime island float32 data (fuzz_graphs seed 1137)."""
    from onnx import helper

    g, b = (rng.random(96) + 0.5).astype(H), (rng.standard_normal(96) * 0.1).astype(H)
    skip = rng.standard_normal(x.shape).astype(H)
    node = helper.make_node("SkipLayerNormalization", ["x", "skip", "g", "b"], ["y", "", "", "sum"], domain=MS)
    model = graph_of([node], {"x": x, "skip": skip}, [("y", H), ("sum", H)], {"g": g, "b": b})
    out = ort_check(model, {"x": x, "skip": skip}, rtol=4e-4)
    assert out["sum"].dtype == H


def test_softmax(x, single_node, ort_check):
    scaled = (x * H(4)).astype(H)
    ort_check(single_node("Softmax", {"x": scaled}, [("y", H)], {"axis": -1}), {"x": scaled}, rtol=ONE_ROUNDING)


def test_resize_linear(rng, single_node, ort_check):
    img = rng.standard_normal((1, 4, 9, 7)).astype(H)
    model = single_node("Resize", {"x": img}, [("y", H)], {"mode": "linear"},
                        initializers={"roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2, 2], np.float32)})
    ort_check(model, {"x": img}, rtol=ONE_ROUNDING)


def test_matmul_and_conv_with_constant_weights(x, rng, single_node, ort_check):
    w = (rng.standard_normal((96, 48)) * 0.1).astype(H)
    ort_check(single_node("MatMul", {"x": x}, [("y", H)], initializers={"w": w}), {"x": x})
    img = rng.standard_normal((2, 8, 12, 12)).astype(H)
    cw = (rng.standard_normal((16, 8, 3, 3)) * 0.1).astype(H)
    ort_check(single_node("Conv", {"x": img}, [("y", H)], {"pads": [1, 1, 1, 1]}, initializers={"w": cw}), {"x": img})


def test_read_only_weights_widened_once(rng):
    # A loaded plan's weights are read-only views of the file: widened once per step, then reused.
    from infc.compiler.runtime.kernels import kernel_for
    from infc.compiler.runtime.kernels.common import KernelContext

    a = rng.standard_normal((3, 8)).astype(H)
    w = rng.standard_normal((8, 4)).astype(H)
    w.flags.writeable = False
    ctx = KernelContext(17, [None])
    kernel = kernel_for("", "MatMul")
    first = kernel([a, w], {}, ctx)[0]
    widened = ctx.memo["half"][1][1]
    second = kernel([a, w], {}, ctx)[0]
    assert ctx.memo["half"][1][1] is widened and first.dtype == H
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(first, (a.astype(np.float32) @ w.astype(np.float32)).astype(H))
