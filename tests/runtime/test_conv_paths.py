"""The depthwise (band GEMM) and per-tap dense convolution paths, against onnxruntime; blocks and
chunks made tiny so every branch (several blocks, output copies, partial tiles) runs."""

import numpy as np
import pytest

from infc.compiler.runtime.kernels import conv, conv_taps, depthwise

F32 = np.float32

DEPTHWISE = [  # x, w, attrs
    ((1, 6, 12, 10), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),
    ((2, 5, 9, 11), (5, 1, 5, 5), {"group": 5, "pads": [2, 2, 2, 2]}),  # several images: output copy
    ((1, 8, 13, 12), (8, 1, 3, 3), {"group": 8, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 4, 11, 16), (4, 1, 5, 5), {"group": 4, "strides": [2, 1], "pads": [2, 1, 0, 2]}),
    ((1, 4, 12, 9), (4, 1, 3, 3), {"group": 4, "strides": [1, 2], "pads": [0, 1, 2, 1]}),
    ((1, 3, 14, 14), (3, 1, 3, 3), {"group": 3, "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((1, 3, 10, 12), (3, 1, 3, 2), {"group": 3, "dilations": [2, 3], "strides": [2, 1]}),
    ((2, 4, 9, 9), (8, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),  # channel multiplier 2
    ((1, 5, 7, 9), (5, 1, 3, 3), {"group": 5, "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 5, 7, 9), (5, 1, 3, 3), {"group": 5, "auto_pad": "SAME_LOWER"}),
    ((3, 7, 2, 15), (7, 1, 5, 5), {"group": 7, "pads": [2, 2, 2, 2]}),  # fewer rows than the kernel
    ((1, 6, 21, 8), (6, 1, 7, 7), {"group": 6, "pads": [3, 3, 3, 3]}),  # several row tiles
]


@pytest.mark.parametrize("block_bytes", [256, 1 << 20])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("x_shape,w_shape,attrs", DEPTHWISE)
def test_depthwise_matches_ort(x_shape, w_shape, attrs, with_bias, block_bytes, monkeypatch, rng, single_node,
                               ort_check):
    monkeypatch.setattr(depthwise, "BLOCK_BYTES", block_bytes)
    x = rng.standard_normal(x_shape).astype(F32)
    inits = {"w": rng.standard_normal(w_shape).astype(F32)}
    if with_bias:
        inits["b"] = rng.standard_normal(w_shape[0]).astype(F32)
    assert conv.conv_plan(x.shape, x.dtype, w_shape, attrs, None).kind == conv.DEPTHWISE
    ort_check(single_node("Conv", {"x": x}, [("y", F32)], attrs, inits), {"x": x})


TAPS = [  # narrowing convolutions: more input than output channels
    ((1, 12, 9, 10), (4, 12, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 16, 7, 8), (5, 16, 3, 3), {"pads": [1, 0, 2, 1]}),
    ((1, 10, 8, 8), (3, 10, 5, 5), {}),
    ((1, 9, 6, 11), (2, 9, 3, 2), {"auto_pad": "SAME_UPPER"}),
]


@pytest.mark.parametrize("chunk", [7, 4096])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("x_shape,w_shape,attrs", TAPS)
def test_per_tap_dense_matches_ort(x_shape, w_shape, attrs, with_bias, chunk, monkeypatch, rng, single_node, ort_check):
    monkeypatch.setattr(conv_taps, "CHUNK", chunk)
    x = rng.standard_normal(x_shape).astype(F32)
    inits = {"w": rng.standard_normal(w_shape).astype(F32)}
    if with_bias:
        inits["b"] = rng.standard_normal(w_shape[0]).astype(F32)
    assert conv.conv_plan(x.shape, x.dtype, w_shape, attrs, None).kind == conv.TAPS_DENSE
    ort_check(single_node("Conv", {"x": x}, [("y", F32)], attrs, inits), {"x": x})


def test_band_matrices_follow_new_weights(rng):
    x = rng.standard_normal((1, 4, 8, 8)).astype(F32)
    attrs = {"group": 4, "pads": [1, 1, 1, 1]}
    memo = {}
    first_w, second_w = (rng.standard_normal((4, 1, 3, 3)).astype(F32) for _ in range(2))
    first = conv.conv_forward(x, first_w, None, attrs, memo=memo)
    second = conv.conv_forward(x, second_w, None, attrs, memo=memo)
    plan = conv.conv_plan(x.shape, x.dtype, first_w.shape, attrs, None)
    np.testing.assert_allclose(second, conv._generic(x, second_w, None, plan), rtol=1e-5, atol=1e-5)
    assert not np.allclose(first, second)


ONE_D = [  # 1-D convolutions (audio front ends, VAD encoders): the gathered columns path
    ((1, 129, 4), (128, 129, 3), {"pads": [1, 1]}),
    ((1, 1, 640), (258, 1, 256), {"strides": [128]}),  # STFT as a convolution
    ((2, 8, 9), (6, 8, 3), {"strides": [2], "pads": [1, 1]}),
    ((1, 4, 17), (5, 4, 3), {"dilations": [3], "pads": [2, 4]}),
    ((2, 6, 11), (9, 2, 5), {"group": 3, "pads": [2, 2]}),
    ((1, 3, 10), (4, 3, 4), {"auto_pad": "SAME_UPPER", "strides": [3]}),
    ((1, 4, 1), (8, 4, 3), {"pads": [1, 1]}),  # one frame
]


@pytest.mark.parametrize("take_bytes", [0, 1 << 20])
@pytest.mark.parametrize("x_shape,w_shape,attrs", ONE_D)
def test_one_d_columns_match_ort(x_shape, w_shape, attrs, take_bytes, monkeypatch, rng, single_node, ort_check):
    monkeypatch.setattr(conv, "TAKE_COLUMNS_BYTES", take_bytes)
    x = rng.standard_normal(x_shape).astype(F32)
    inits = {"w": rng.standard_normal(w_shape).astype(F32), "b": rng.standard_normal(w_shape[0]).astype(F32)}
    assert conv.conv_plan(x.shape, x.dtype, w_shape, attrs, None).kind == conv.GENERIC
    memo = {}
    conv.conv_forward(x, inits["w"], inits["b"], {**attrs, "kernel_shape": list(w_shape[2:])}, memo=memo)
    assert any(key[0] == "conv1d-taps" for key in memo) == (take_bytes > 0)
    ort_check(single_node("Conv", {"x": x}, [("y", F32)], attrs, inits, opset=17), {"x": x})
