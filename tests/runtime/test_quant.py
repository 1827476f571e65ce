import numpy as np
import pytest

F32 = np.float32


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_dequantize(dtype, per_axis, rng, single_node, ort_check):
    x = (rng.standard_normal((2, 3, 4)) * 50).astype(F32)
    scale = np.array([0.5, 0.25, 1.0], F32) if per_axis else np.array(0.4, F32)
    zp = (np.array([3, 10, 0], dtype) if per_axis else np.array(7, dtype))
    attrs = {"axis": 1}
    ort_check(single_node("QuantizeLinear", {"x": x}, [("y", dtype)], attrs, {"s": scale, "z": zp}, opset=13), {"x": x})
    q = rng.integers(0, 100, (2, 3, 4)).astype(dtype)
    ort_check(single_node("DequantizeLinear", {"q": q}, [("y", F32)], attrs, {"s": scale, "z": zp}, opset=13), {"q": q})


def test_blocked_quantization(rng, single_node, ort_check):
    x = rng.standard_normal((4, 6)).astype(F32)
    scale = rng.random((4, 2)).astype(F32) + 0.1
    zp = np.zeros((4, 2), np.int8)
    ort_check(single_node("QuantizeLinear", {"x": x}, [("y", np.int8)], {"axis": 1, "block_size": 3},
                          {"s": scale, "z": zp}, opset=21), {"x": x})


def test_dynamic_quantize_linear(rng, single_node, native):
    # bit-exact with onnxruntime: its scale is computed in float32, and one ulp off flips bins
    import onnxruntime as ort

    outs = [("y", np.uint8), ("s", F32), ("z", np.uint8)]
    model = single_node("DynamicQuantizeLinear", {"x": np.zeros((64, 50), F32)}, outs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for _ in range(40):
        x = (rng.standard_normal((64, 50)) * rng.uniform(0.01, 10) + rng.uniform(-3, 3)).astype(F32)
        expected = session.run(None, {"x": x})
        actual = native(model, {"x": x})
        for got, want in zip((actual[n] for n, _ in outs), expected):
            np.testing.assert_array_equal(got, want)


def test_matmul_integer_and_qlinear(rng, single_node, ort_check):
    a = rng.integers(0, 255, (3, 4)).astype(np.uint8)
    b = rng.integers(0, 255, (4, 5)).astype(np.uint8)
    inits = {"az": np.array(12, np.uint8), "bz": np.array(130, np.uint8)}
    model = single_node("MatMulInteger", {"a": a, "b": b}, [("y", np.int32)], initializers=inits)
    ort_check(model, {"a": a, "b": b})
    qinits = {"as": np.array(0.02, F32), "az": np.array(12, np.uint8), "bs": np.array(0.03, F32),
              "bz": np.array(130, np.uint8), "ys": np.array(0.5, F32), "yz": np.array(100, np.uint8)}
    model = single_node("QLinearMatMul", {"a": a, "b": b}, [("y", np.uint8)], initializers=qinits,
                        input_names=["a", "as", "az", "b", "bs", "bz", "ys", "yz"])
    ort_check(model, {"a": a, "b": b})


def test_conv_integer_and_qlinear_conv(rng, single_node, ort_check):
    x = rng.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)
    w = rng.integers(0, 255, (3, 2, 3, 3)).astype(np.uint8)
    model = single_node("ConvInteger", {"x": x}, [("y", np.int32)], {"pads": [1, 1, 1, 1]},
                        {"w": w, "xz": np.array(100, np.uint8), "wz": np.array(128, np.uint8)})
    ort_check(model, {"x": x})
    # weights within [-64, 64]: on x86 without VNNI onnxruntime's u8 x s8 kernels saturate wider ones
    # (quantize/weight_range.py), and infc's exact sums are compared with its output here
    wi = rng.integers(-64, 65, (3, 2, 3, 3)).astype(np.int8)
    inits = {"xs": np.array(0.05, F32), "xz": np.array(100, np.uint8), "w": wi, "ws": np.array([0.01, 0.02, 0.03], F32),
             "wz": np.zeros(3, np.int8), "ys": np.array(0.4, F32), "yz": np.array(90, np.uint8),
             "b": np.array([5, -7, 100], np.int32)}
    model = single_node("QLinearConv", {"x": x}, [("y", np.uint8)], {"pads": [1, 1, 1, 1]}, inits,
                        input_names=["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"])
    ort_check(model, {"x": x})


@pytest.mark.parametrize("b_dtype, per_column", [(np.int8, True), (np.uint8, False), (np.uint8, True)])
def test_matmul_integer_on_a_constant_weight_gives_the_same_sums_from_onnxruntimes_kernel(b_dtype, per_column, rng):
    """From its second call on the same weight array the kernel runs onnxruntime's MatMulInteger
    (runtime/integer_gemm.py) where this CPU's is exact: the same int32 sums as the float32 blocks."""
    from infc.compiler.runtime import integer_gemm
    from infc.compiler.runtime.kernels.common import KernelContext
    from infc.compiler.runtime.kernels.quant import matmul_integer

    low, high = (-128, 128) if b_dtype == np.int8 else (0, 256)
    b = rng.integers(low, high, (700, 48)).astype(b_dtype)
    b_zero = rng.integers(0, 20, 48 if per_column else ()).astype(b_dtype)
    ctx = KernelContext(17)
    expected = None
    for call in range(3):
        a = rng.integers(0, 256, (2, 9, 700)).astype(np.uint8)
        a[0, 0] = 255  # the largest sums
        a_zero = np.array(call * 40, np.uint8)
        got = matmul_integer([a, b, a_zero, b_zero], {}, ctx)[0]
        expected = (a.astype(np.int64) - int(a_zero)) @ (b.astype(np.int64) - b_zero.astype(np.int64))
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, expected)
    session = ctx.memo["matmul-integer-session"][2]
    assert bool(session) == integer_gemm.is_exact()  # the later calls ran there where it is exact


def test_qlinear_matmul_on_a_constant_weight_is_the_same_from_onnxruntimes_integer_kernel(rng):
    from infc.compiler.runtime.kernels.common import KernelContext
    from infc.compiler.runtime.kernels.quant import qlinear_matmul

    b = rng.integers(0, 256, (300, 20)).astype(np.uint8)
    scales = [np.array(0.02, F32), np.array(0.03, F32), np.array(0.5, F32)]
    zeros = [np.array(12, np.uint8), np.array(130, np.uint8), np.array(100, np.uint8)]
    ctx = KernelContext(17)
    for _ in range(3):
        a = rng.integers(0, 256, (7, 300)).astype(np.uint8)
        inputs = [a, scales[0], zeros[0], b, scales[1], zeros[1], scales[2], zeros[2]]
        got = qlinear_matmul(inputs, {}, ctx)[0]  # from the second call in onnxruntime where exact
        first_sight = qlinear_matmul(inputs, {}, KernelContext(17))[0]  # a new step: the float32 blocks
        np.testing.assert_array_equal(got, first_sight)
