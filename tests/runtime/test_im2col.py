"""The phase-layout conv paths with tiny cache blocks, so every block / chunk / bias-row branch runs."""

import numpy as np
import pytest

from infc.compiler.runtime.kernels import im2col

F32 = np.float32

CASES = [  # x, w, attrs
    ((2, 5, 13, 11), (7, 5, 3, 3), {"pads": [1, 2, 0, 1]}),
    ((1, 4, 17, 9), (6, 4, 3, 2), {"strides": [2, 2], "pads": [1, 0, 1, 1]}),
    ((1, 3, 15, 16), (4, 3, 5, 5), {"strides": [2, 1], "pads": [2, 2, 2, 2]}),
    ((2, 6, 12, 10), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),
    ((1, 9, 11, 14), (9, 1, 5, 5), {"group": 9, "strides": [2, 2], "pads": [2, 2, 2, 2]}),
    ((1, 8, 7, 13), (8, 1, 3, 3), {"group": 8, "strides": [1, 2], "pads": [0, 1, 2, 1]}),
]


@pytest.mark.parametrize("cache_bytes", [512, 1 << 20])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("x_shape,w_shape,attrs", CASES)
def test_phase_paths_match_ort(x_shape, w_shape, attrs, with_bias, cache_bytes, monkeypatch, rng, single_node,
                               ort_check):
    monkeypatch.setattr(im2col, "CACHE_BYTES", cache_bytes)
    monkeypatch.setattr(im2col, "MIN_GEMM_WIDTH", 16 if cache_bytes < 4096 else im2col.MIN_GEMM_WIDTH)
    x = rng.standard_normal(x_shape).astype(F32)
    inits = {"w": rng.standard_normal(w_shape).astype(F32)}
    if with_bias:
        inits["b"] = rng.standard_normal(w_shape[0]).astype(F32)
    model = single_node("Conv", {"x": x}, [("y", F32)], attrs, inits)
    ort_check(model, {"x": x})


def test_plans_are_reused_and_follow_new_weights(rng, single_node, native):
    x = rng.standard_normal((1, 4, 9, 9)).astype(F32)
    w = rng.standard_normal((5, 4, 3, 3)).astype(F32)
    memo = {}
    first = im2col.dense2d(x, w, None, (1, 1), (1, 1), (1, 1), (9, 9), memo)
    assert len(memo) == 2  # the layout and the reordered weights
    second = im2col.dense2d(x, w * 2, None, (1, 1), (1, 1), (1, 1), (9, 9), memo)
    np.testing.assert_allclose(second, 2 * first, rtol=1e-5, atol=1e-6)
