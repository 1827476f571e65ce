import numpy as np
import pytest

F32 = np.float32

WINDOWS = [
    {"kernel_shape": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 2], "auto_pad": "SAME_UPPER", "strides": [2, 1]},
    {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
]


@pytest.mark.parametrize("attrs", WINDOWS)
def test_max_pool(attrs, rng, single_node, ort_check):
    x = rng.standard_normal((2, 3, 9, 8)).astype(F32)
    ort_check(single_node("MaxPool", {"x": x}, [("y", F32)], attrs, opset=12), {"x": x})


def test_max_pool_dilations_and_indices(rng, single_node, ort_check):
    x = rng.standard_normal((1, 2, 7, 7)).astype(F32)
    attrs = {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 0, 0, 1]}
    ort_check(single_node("MaxPool", {"x": x}, [("y", F32), ("i", np.int64)], attrs, opset=12), {"x": x})
    ort_check(single_node("MaxPool", {"x": x}, [("y", F32), ("i", np.int64)], {"kernel_shape": [3, 3], "strides": [2, 2]},
                          opset=12), {"x": x})


@pytest.mark.parametrize("attrs", WINDOWS)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool(attrs, count_include_pad, rng, single_node, ort_check):
    x = rng.standard_normal((2, 3, 9, 8)).astype(F32)
    ort_check(single_node("AveragePool", {"x": x}, [("y", F32)], {**attrs, "count_include_pad": count_include_pad},
                          opset=19), {"x": x})


def test_lp_pool_and_globals(rng, single_node, ort_check):
    x = rng.standard_normal((2, 3, 6, 5)).astype(F32)
    ort_check(single_node("LpPool", {"x": x}, [("y", F32)], {"kernel_shape": [2, 2], "p": 2}, opset=18), {"x": x})
    for op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):
        ort_check(single_node(op, {"x": x}, [("y", F32)]), {"x": x})


def test_global_average_pool_large_image_accuracy(rng, single_node, ort_check):
    x = rng.random((1, 4, 160, 160)).astype(F32) * 50
    ort_check(single_node("GlobalAveragePool", {"x": x}, [("y", F32)]), {"x": x}, rtol=5e-5)


# Kernels with more taps than output positions: reduced one window at a time, clipped to the input.
LARGE_WINDOWS = [
    {"kernel_shape": [7, 7]},
    {"kernel_shape": [4, 4], "strides": [4, 4]},
    {"kernel_shape": [5, 5], "strides": [3, 3], "pads": [2, 1, 2, 1]},
    # a window far larger than the image: the ceil_mode overhang must be neither padded nor counted
    {"kernel_shape": [64, 64], "strides": [64, 64], "ceil_mode": 1},
]


@pytest.mark.parametrize("attrs", LARGE_WINDOWS)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool_large_windows(attrs, count_include_pad, rng, single_node, ort_check):
    x = rng.standard_normal((2, 3, 7, 8)).astype(F32)
    ort_check(single_node("AveragePool", {"x": x}, [("y", F32)], {**attrs, "count_include_pad": count_include_pad},
                          opset=19), {"x": x})


@pytest.mark.parametrize("attrs", LARGE_WINDOWS)
def test_max_pool_large_windows(attrs, rng, single_node, ort_check):
    x = rng.standard_normal((2, 3, 7, 8)).astype(F32)
    ort_check(single_node("MaxPool", {"x": x}, [("y", F32)], attrs, opset=12), {"x": x})


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("attrs", WINDOWS + LARGE_WINDOWS + [{"kernel_shape": [3, 2], "dilations": [2, 1], "pads": [2, 0, 1, 1]}])
def test_compiled_pool_matches_numpy_path(op, attrs, rng):
    # The compiled 2-D pool (jit_pool.py) never pads a copy: it must agree with the tap loop exactly.
    from infc.compiler.runtime import jit
    from infc.compiler.runtime.kernels import kernel_for
    from infc.compiler.runtime.kernels.common import KernelContext

    kernel = kernel_for("", op)
    for dtype in (F32, np.float64):
        x = rng.standard_normal((2, 3, 9, 8)).astype(dtype)
        for count_include_pad in (0, 1):
            full = {**attrs, "count_include_pad": count_include_pad} if op == "AveragePool" else attrs
            compiled = kernel([x], full, KernelContext(17, [None]))[0]
            with jit.disabled():
                reference = kernel([x], full, KernelContext(17, [None]))[0]
            assert compiled.dtype == dtype
            tolerance = 1e-6 if dtype == F32 else 1e-12  # sums in another order
            np.testing.assert_allclose(compiled, reference, rtol=tolerance, atol=tolerance)
