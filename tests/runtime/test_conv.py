import numpy as np
import pytest

F32 = np.float32
MS = "com.microsoft"

CASES = [  # (x shape, w shape, attrs)
    ((1, 3, 9, 9), (4, 3, 3, 3), {}),
    ((2, 3, 9, 8), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 3, 10, 10), (5, 3, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 2]}),
    ((1, 2, 11, 11), (3, 2, 3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((1, 3, 7, 9), (4, 3, 3, 2), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 3, 7, 9), (4, 3, 3, 2), {"auto_pad": "SAME_LOWER"}),
    ((1, 3, 7, 9), (4, 3, 3, 3), {"auto_pad": "VALID", "strides": [1, 2]}),
    ((1, 4, 6, 6), (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    ((2, 8, 12, 12), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}),  # depthwise
    ((1, 8, 12, 12), (8, 1, 5, 5), {"group": 8, "pads": [2, 2, 2, 2], "strides": [2, 2]}),  # depthwise, strided
    ((1, 4, 9, 9), (8, 1, 3, 3), {"group": 4}),  # depthwise with channel multiplier
    ((1, 16, 7, 7), (24, 16, 1, 1), {}),  # pointwise, no copy
    ((1, 16, 8, 8), (24, 16, 1, 1), {"strides": [2, 2]}),
    ((1, 3, 20), (4, 3, 5), {"pads": [2, 1], "strides": [2]}),  # 1-D
    ((1, 2, 5, 6, 7), (3, 2, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}),  # 3-D
]


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("x_shape,w_shape,attrs", CASES)
def test_conv_matches_ort(x_shape, w_shape, attrs, with_bias, rng, single_node, ort_check):
    x = rng.standard_normal(x_shape).astype(F32)
    inits = {"w": rng.standard_normal(w_shape).astype(F32)}
    if with_bias:
        inits["b"] = rng.standard_normal(w_shape[0]).astype(F32)
    ort_check(single_node("Conv", {"x": x}, [("y", F32)], attrs, inits, opset=17), {"x": x})


FUSED = [("Relu", []), ("Tanh", []), ("Sigmoid", []), ("LeakyRelu", [0.1]), ("Clip", [-0.5, 0.7]),
         ("HardSigmoid", [0.3, 0.4])]


@pytest.mark.parametrize("activation,params", FUSED)
@pytest.mark.parametrize("depthwise", [False, True])
def test_fused_conv_activations(activation, params, depthwise, rng, single_node, ort_check):
    x = rng.standard_normal((1, 4, 8, 8)).astype(F32)
    w = rng.standard_normal((4, 1, 3, 3) if depthwise else (6, 4, 3, 3)).astype(F32)
    attrs = {"pads": [1, 1, 1, 1], "activation": activation, "group": 4 if depthwise else 1}
    if params:
        attrs["activation_params"] = params
    inits = {"w": w, "b": rng.standard_normal(w.shape[0]).astype(F32)}
    ort_check(single_node("FusedConv", {"x": x}, [("y", F32)], attrs, inits, domain=MS), {"x": x})


def test_fused_conv_with_sum_input(rng, single_node, ort_check):
    x = rng.standard_normal((1, 4, 6, 6)).astype(F32)
    z = rng.standard_normal((1, 5, 6, 6)).astype(F32)
    inits = {"w": rng.standard_normal((5, 4, 3, 3)).astype(F32), "b": rng.standard_normal(5).astype(F32)}
    model = single_node("FusedConv", {"x": x, "z": z}, [("y", F32)], {"pads": [1, 1, 1, 1], "activation": "Relu"},
                        inits, domain=MS, input_names=["x", "w", "b", "z"])
    ort_check(model, {"x": x, "z": z})


TRANSPOSED = [
    ((1, 3, 4, 4), (3, 2, 3, 3), {}),
    ((1, 3, 4, 4), (3, 2, 2, 2), {"strides": [2, 2]}),
    ((2, 3, 5, 4), (3, 2, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    ((1, 4, 4, 4), (4, 1, 3, 3), {"group": 2, "dilations": [2, 2]}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "output_shape": [9, 9]}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 6), (2, 3, 3), {"strides": [3], "pads": [1, 0]}),
    ((2, 4, 3, 5), (4, 3, 2, 2), {"strides": [2, 2], "group": 2}),  # stride == kernel: patches, no col2im
    ((2, 2, 6), (2, 3, 3), {"strides": [3]}),
]


@pytest.mark.parametrize("x_shape,w_shape,attrs", TRANSPOSED)
def test_conv_transpose(x_shape, w_shape, attrs, rng, single_node, ort_check):
    x = rng.standard_normal(x_shape).astype(F32)
    group = attrs.get("group", 1)
    inits = {"w": rng.standard_normal(w_shape).astype(F32), "b": rng.standard_normal(w_shape[1] * group).astype(F32)}
    ort_check(single_node("ConvTranspose", {"x": x}, [("y", F32)], attrs, inits), {"x": x})


@pytest.mark.parametrize("x_shape,w_shape,attrs", [
    ((1, 8, 200, 200), (16, 8, 1, 1), {}),  # pointwise, output in column blocks (shared with the helper thread)
    ((1, 24, 120, 120), (24, 1, 3, 3), {"group": 24, "pads": [1, 1, 1, 1]}),  # depthwise, many blocks
    ((1, 16, 150, 150), (8, 16, 3, 3), {"pads": [1, 1, 1, 1]}),  # dense, chunked GEMMs
])
def test_large_convs_with_fused_activation(x_shape, w_shape, attrs, rng, single_node, ort_check):
    x = rng.standard_normal(x_shape).astype(F32)
    inits = {"w": rng.standard_normal(w_shape).astype(F32), "b": rng.standard_normal(w_shape[0]).astype(F32)}
    model = single_node("FusedConv", {"x": x}, [("y", F32)], {**attrs, "activation": "HardSigmoid",
                                                             "activation_params": [0.2, 0.5]}, inits, domain=MS)
    ort_check(model, {"x": x})
