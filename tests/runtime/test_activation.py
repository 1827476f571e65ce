import numpy as np
import pytest

F32 = np.float32

FLOAT_OPS = [
    ("Relu", {}), ("LeakyRelu", {"alpha": 0.2}), ("LeakyRelu", {"alpha": 1.5}), ("Elu", {"alpha": 0.7}),
    ("Selu", {}), ("Celu", {"alpha": 1.3}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("HardSwish", {}),
    ("Sigmoid", {}), ("Tanh", {}), ("Softplus", {}), ("Softsign", {}), ("Mish", {}),
    ("ThresholdedRelu", {"alpha": 0.5}), ("Shrink", {"lambd": 0.6, "bias": 0.2}),
]


@pytest.mark.parametrize("op,attrs", FLOAT_OPS, ids=[f"{o}{i}" for i, (o, _) in enumerate(FLOAT_OPS)])
def test_float_activations_match_ort(op, attrs, rng, single_node, ort_check):
    x = (rng.standard_normal((2, 3, 5)) * 3).astype(F32)
    ort_check(single_node(op, {"x": x}, [("y", F32)], attrs, opset=18), {"x": x})


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_onnx_gelu(approximate, rng, single_node, ort_check):
    x = (rng.standard_normal((4, 33)) * 3).astype(F32)
    ort_check(single_node("Gelu", {"x": x}, [("y", F32)], {"approximate": approximate}, opset=20), {"x": x})


@pytest.mark.parametrize("op,attrs", [("Gelu", {}), ("QuickGelu", {}), ("QuickGelu", {"alpha": 1.2}), ("FastGelu", {})])
def test_contrib_gelus(op, attrs, rng, single_node, ort_check):
    x = (rng.standard_normal((2, 5, 16)) * 3).astype(F32)
    ort_check(single_node(op, {"x": x}, [("y", F32)], attrs, domain="com.microsoft"), {"x": x})


def test_fast_gelu_with_bias_and_bias_gelu(rng, single_node, ort_check):
    x = rng.standard_normal((2, 5, 16)).astype(F32)
    b = rng.standard_normal(16).astype(F32)
    ort_check(single_node("FastGelu", {"x": x}, [("y", F32)], initializers={"b": b}, domain="com.microsoft"), {"x": x})
    ort_check(single_node("BiasGelu", {"x": x}, [("y", F32)], initializers={"b": b}, domain="com.microsoft"), {"x": x})


def test_prelu_broadcast_slope(rng, single_node, ort_check):
    x = rng.standard_normal((2, 4, 3, 3)).astype(F32)
    slope = rng.random((4, 1, 1)).astype(F32)
    ort_check(single_node("PRelu", {"x": x}, [("y", F32)], initializers={"s": slope}), {"x": x})


@pytest.mark.parametrize("opset", [6, 13])
def test_clip_forms(opset, rng, single_node, ort_check):
    x = (rng.standard_normal((3, 7)) * 4).astype(F32)
    if opset < 11:
        model = single_node("Clip", {"x": x}, [("y", F32)], {"min": -1.0, "max": 2.0}, opset=opset)
    else:
        model = single_node("Clip", {"x": x}, [("y", F32)], initializers={"lo": np.array(-1, F32), "hi": np.array(2, F32)},
                            opset=opset)
    ort_check(model, {"x": x})


def test_clip_int_with_only_max(single_node, ort_check):
    x = np.arange(-5, 5, dtype=np.int32)
    model = single_node("Clip", {"x": x}, [("y", np.int32)], input_names=["x", "", "hi"],
                        initializers={"hi": np.array(2, np.int32)}, opset=13)
    ort_check(model, {"x": x})


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset,axis", [(11, 1), (11, -1), (13, 1), (13, -1)])
def test_softmax_family(op, opset, axis, rng, single_node, ort_check):
    x = (rng.standard_normal((2, 3, 4)) * 5).astype(F32)
    ort_check(single_node(op, {"x": x}, [("y", F32)], {"axis": axis}, opset=opset), {"x": x})


def test_compiled_softmax_matches_numpy_path(rng):
    # A standalone Softmax over the last axis runs the attention kernel's softmax pass
    # (jit_attention.softmax_last): rows all -inf give zeros, a NaN makes its row NaN, large
    # values take the classic path, as in activation.softmax_last.
    from infc.compiler.runtime import jit
    from infc.compiler.runtime.kernels import kernel_for
    from infc.compiler.runtime.kernels.common import KernelContext

    x = (rng.standard_normal((2, 3, 5, 17)) * 4).astype(np.float32)
    x[0, 0, 0] = -np.inf
    x[0, 1, 2, 3] = np.nan
    x[1, 2, 4] += 200.0
    strided = x[..., ::2]  # a non-contiguous input
    softmax = kernel_for("", "Softmax")
    for data in (x, strided):
        compiled = softmax([data], {"axis": -1}, KernelContext(17, [None]))[0]
        with jit.disabled():
            reference = softmax([data], {"axis": -1}, KernelContext(17, [None]))[0]
        np.testing.assert_allclose(compiled, reference, rtol=2e-6, atol=1e-7)
    assert not np.shares_memory(compiled, strided)
