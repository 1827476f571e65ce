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
# Strides over 1: the compiled kernel's phase split (jit_pool.py), pads one-sided and asymmetric
STRIDED = [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},  # ResNet's stem
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 1, 1, 0], "ceil_mode": 1},
    {"kernel_shape": [2, 3], "strides": [3, 2], "pads": [1, 0, 0, 2]},
    {"kernel_shape": [3, 2], "strides": [2, 3], "dilations": [2, 2], "pads": [2, 1, 1, 1]},
    {"kernel_shape": [5, 5], "strides": [2, 2], "pads": [2, 2, 2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "strides": [4, 4], "dilations": [1, 3], "ceil_mode": 1},
    {"kernel_shape": [1, 1], "strides": [2, 2]},
    {"kernel_shape": [2, 2], "strides": [2, 2]},
]


@pytest.mark.parametrize("attrs", WINDOWS + STRIDED)
@pytest.mark.parametrize("dtype", [F32, np.float64])
def test_max_pool(attrs, dtype, rng, single_node, ort_check):
    x = rng.standard_normal((2, 3, 13, 11)).astype(dtype)
    ort_check(single_node("MaxPool", {"x": x}, [("y", dtype)], attrs, opset=12), {"x": x})


def test_max_pool_dilations_and_indices(rng, single_node, ort_check):
    x = rng.standard_normal((1, 2, 7, 7)).astype(F32)
    attrs = {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 0, 0, 1]}
    ort_check(single_node("MaxPool", {"x": x}, [("y", F32), ("i", np.int64)], attrs, opset=12), {"x": x})
    ort_check(single_node("MaxPool", {"x": x}, [("y", F32), ("i", np.int64)], {"kernel_shape": [3, 3], "strides": [2, 2]},
                          opset=12), {"x": x})


@pytest.mark.parametrize("attrs", WINDOWS + STRIDED)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool(attrs, count_include_pad, rng, single_node, ort_check):
    # onnxruntime has no float64 AveragePool: float64 is checked against the reference fold below
    x = rng.standard_normal((2, 3, 13, 11)).astype(F32)
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
    {"kernel_shape": [1280, 1280], "strides": [1280, 1280], "ceil_mode": 1},  # EfficientNet's, over 7x8
]


@pytest.mark.parametrize("attrs", LARGE_WINDOWS)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool_large_windows(attrs, count_include_pad, rng, single_node, ort_check):
    x = rng.standard_normal((2, 3, 7, 8)).astype(F32)
    ort_check(single_node("AveragePool", {"x": x}, [("y", F32)], {**attrs, "count_include_pad": count_include_pad},
                          opset=19), {"x": x})


def test_windows_far_larger_than_the_image_leave_the_compiled_path():
    # EfficientNet's AvgPool(1280, ceil_mode) over 7x7: the compiled kernel's padded phase scratch
    # would be 1286 x 1286 per plane (3.7 s for the model); the NumPy path reduces the one window
    from infc.compiler.runtime.kernels.conv import geometry
    from infc.compiler.runtime.kernels.jit_pool import pool2d

    attrs = {"kernel_shape": [1280, 1280], "strides": [1280, 1280], "ceil_mode": 1}
    x = np.ones((1, 4, 7, 7), F32)
    assert pool2d(x, (1280, 1280), geometry((7, 7), (1280, 1280), attrs, ceil_mode=True), is_max=False) is None
    assert pool2d(x, (3, 3), geometry((7, 7), (3, 3), {"strides": [2, 2]}), is_max=True) is not None or \
        not _compiled_available()


def _compiled_available() -> bool:
    from infc.compiler.runtime import jit

    return jit.enabled()


@pytest.mark.parametrize("attrs", LARGE_WINDOWS)
def test_max_pool_large_windows(attrs, rng, single_node, ort_check):
    x = rng.standard_normal((2, 3, 7, 8)).astype(F32)
    ort_check(single_node("MaxPool", {"x": x}, [("y", F32)], attrs, opset=12), {"x": x})


# The compiled 2-D pool splits each plane into stride phases and fills the padding (jit_pool.py):
# strides 2 to 4, pads on one side only, dilations, the ceil_mode overhang, on odd sizes.


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("attrs", WINDOWS + LARGE_WINDOWS + STRIDED + [
    {"kernel_shape": [3, 2], "dilations": [2, 1], "pads": [2, 0, 1, 1]}])
def test_compiled_pool_matches_numpy_path(op, attrs, rng):
    # The compiled 2-D pool (jit_pool.py) must agree with the NumPy tap loop.
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


def _reference_pool(x, attrs, is_max: bool, count_include_pad: int) -> np.ndarray:
    """The compiled kernel's contract, one output at a time: a max folds `o if o >= v else v` from
    -inf over the taps inside the image in row-major order (a NaN tap wins until a later tap
    replaces it); an average sums them from +0 in that order and divides by the taps counted."""
    from infc.compiler.runtime.kernels.conv import geometry

    kernel = attrs["kernel_shape"]
    geo = geometry(x.shape[2:], kernel, attrs, ceil_mode=bool(attrs.get("ceil_mode", 0)))
    height, width = x.shape[2:]
    t = x.dtype.type
    y = np.empty(x.shape[:2] + tuple(geo.out), x.dtype)
    for n, c, oh, ow in np.ndindex(*y.shape):
        total, count = t(-np.inf) if is_max else t(0), 0
        for i, j in np.ndindex(*kernel):
            r = oh * geo.strides[0] + i * geo.dilations[0] - geo.pads_begin[0]
            col = ow * geo.strides[1] + j * geo.dilations[1] - geo.pads_begin[1]
            inside = 0 <= r < height and 0 <= col < width
            if count_include_pad:  # the explicit pads count, the ceil_mode overhang does not
                count += (-geo.pads_begin[0] <= r < height + geo.pads_end[0]
                          and -geo.pads_begin[1] <= col < width + geo.pads_end[1])
            else:
                count += inside
            if inside:
                v = x[n, c, r, col]
                with np.errstate(invalid="ignore"):  # inf - inf
                    total = (total if total >= v else v) if is_max else total + v  # noqa: FURB136
        y[n, c, oh, ow] = total if is_max else (total / t(count) if count else t(0))
    return y


def _special_values(shape, dtype, rng) -> np.ndarray:
    """Ties, NaN, signed zeros and infinities: where a fold's order and the padding could show."""
    x = np.round(rng.standard_normal(shape) * 2).astype(dtype) / 2
    pick = rng.random(shape)
    x[pick < 0.1] = np.nan
    x[(pick >= 0.1) & (pick < 0.2)] = -0.0
    x[(pick >= 0.2) & (pick < 0.25)] = np.inf
    x[(pick >= 0.25) & (pick < 0.3)] = -np.inf
    return x


def _assert_reference_bits(x, attrs):
    """The compiled MaxPool and AveragePool (count_include_pad off and on) against the reference
    fold, bit for bit (signed zeros included); only a NaN's payload may differ: inf - inf sets
    another sign bit on the vector unit than in NumPy's scalar code."""
    from infc.compiler.runtime import jit
    from infc.compiler.runtime.kernels import kernel_for
    from infc.compiler.runtime.kernels.common import KernelContext

    if not jit.enabled():
        pytest.skip("compiled kernels are off (INFC_JIT=0 or numba missing)")
    for op, count_include_pad in (("MaxPool", 0), ("AveragePool", 0), ("AveragePool", 1)):
        full = {**attrs, "count_include_pad": count_include_pad} if op == "AveragePool" else attrs
        got = kernel_for("", op)([x], full, KernelContext(17, [None]))[0]
        expected = _reference_pool(x, attrs, op == "MaxPool", count_include_pad)
        got, expected = (np.where(np.isnan(a), np.nan, a).astype(x.dtype) for a in (got, expected))
        bits = f"u{x.itemsize}"
        differ = np.argwhere(got.view(bits) != expected.view(bits))
        assert not len(differ), (f"{op} count_include_pad={count_include_pad}: {len(differ)} differences, first at "
                                 f"{differ[0].tolist()}: {got[tuple(differ[0])]!r} != {expected[tuple(differ[0])]!r}")


@pytest.mark.parametrize("attrs", STRIDED + WINDOWS + [
    {"kernel_shape": [3, 2], "dilations": [2, 1], "pads": [2, 0, 1, 1]},
    {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]},  # YOLO's SPPF
    {"kernel_shape": [2, 2], "strides": [1, 2], "pads": [0, 3, 0, 3]},  # output columns all padding
    {"kernel_shape": [64, 64], "strides": [64, 64], "ceil_mode": 1},
])
@pytest.mark.parametrize("dtype", [F32, np.float64])
def test_compiled_pool_is_the_reference_fold_bit_for_bit(attrs, dtype, rng):
    # the phase split and the filled padding must not change a bit (the max's padding repeats a
    # tap next to itself, the average's adds +0)
    _assert_reference_bits(_special_values((1, 2, 9, 11), dtype, rng), attrs)


def test_compiled_pool_over_more_than_one_chunk(rng):
    # more output positions than jit_pool.CHUNK: the taps run chunk by chunk
    x = _special_values((1, 1, 50, 52), F32, rng)
    _assert_reference_bits(x, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})
    _assert_reference_bits(x, {"kernel_shape": [3, 2], "dilations": [2, 1], "pads": [2, 1, 2, 0]})


def test_compiled_pool_planes_do_not_depend_on_the_split(rng):
    # Large enough for the planes to be shared with the helper thread: each plane as if alone.
    from infc.compiler.runtime.kernels import kernel_for
    from infc.compiler.runtime.kernels.common import KernelContext

    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    x = rng.standard_normal((2, 32, 40, 41)).astype(F32)
    for op in ("MaxPool", "AveragePool"):
        whole = kernel_for("", op)([x], attrs, KernelContext(17, [None]))[0]
        for n, c in ((0, 0), (1, 17), (1, 31)):
            alone = kernel_for("", op)([x[n:n + 1, c:c + 1]], attrs, KernelContext(17, [None]))[0]
            assert alone.tobytes() == whole[n:n + 1, c:c + 1].tobytes()
