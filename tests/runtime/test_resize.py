import numpy as np
import pytest

F32 = np.float32

MODES = [
    {"mode": "nearest"},
    {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
    {"mode": "nearest", "coordinate_transformation_mode": "align_corners", "nearest_mode": "round_prefer_ceil"},
    {"mode": "linear"},
    {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
    {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
    {"mode": "linear", "coordinate_transformation_mode": "asymmetric"},
    {"mode": "cubic"},
    {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1},
    {"mode": "linear", "antialias": 1},
    {"mode": "cubic", "antialias": 1},
]


@pytest.mark.parametrize("attrs", MODES)
@pytest.mark.parametrize("scales", [[1, 1, 2, 2], [1, 1, 0.6, 1.7], [1, 1, 3, 1]])
def test_resize_scales(attrs, scales, rng, single_node, ort_check):
    x = rng.standard_normal((1, 2, 5, 6)).astype(F32)
    model = single_node("Resize", {"x": x}, [("y", F32)], attrs, {"s": np.array(scales, F32)}, opset=18,
                        input_names=["x", "", "s"])
    ort_check(model, {"x": x})


@pytest.mark.parametrize("attrs", [{"mode": "linear"}, {"mode": "nearest"},
                                   {"mode": "linear", "keep_aspect_ratio_policy": "not_larger", "axes": [2, 3]}])
def test_resize_sizes(attrs, rng, single_node, ort_check):
    x = rng.standard_normal((1, 2, 5, 6)).astype(F32)
    sizes = [7, 4] if "axes" in attrs else [1, 2, 7, 4]
    model = single_node("Resize", {"x": x}, [("y", F32)], attrs, {"s": np.array(sizes, np.int64)}, opset=18,
                        input_names=["x", "", "", "s"])
    ort_check(model, {"x": x})


def test_resize_tf_crop_and_resize(rng, single_node, ort_check):
    x = rng.standard_normal((1, 1, 6, 6)).astype(F32)
    roi = np.array([0, 0, 0.2, 0.3, 1, 1, 0.9, 1.2], F32)
    attrs = {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": -1.0}
    model = single_node("Resize", {"x": x}, [("y", F32)], attrs, {"r": roi, "s": np.array([1, 1, 4, 5], np.int64)},
                        opset=13, input_names=["x", "r", "", "s"])
    ort_check(model, {"x": x})


@pytest.mark.parametrize("opset", [11, 17])
@pytest.mark.parametrize("sizes", [[1, 2, 13, 21], [1, 2, 3, 4], [1, 2, 10, 12]])
def test_resize_tf_half_pixel_for_nn(opset, sizes, rng, single_node, ort_check):
    # tf2onnx's form of TF2's nearest resize (half_pixel_centers=True): source (y + 0.5) / scale,
    # floored; onnxruntime still runs it after opset 13 dropped it from the spec.
    x = rng.standard_normal((1, 2, 5, 6)).astype(F32)
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn", "nearest_mode": "floor"}
    model = single_node("Resize", {"x": x}, [("y", F32)], attrs, {"r": np.zeros(0, F32), "sc": np.zeros(0, F32),
                        "s": np.array(sizes, np.int64)}, opset=opset, input_names=["x", "r", "sc", "s"])
    ort_check(model, {"x": x})


def test_resize_opset10_and_uint8(rng, single_node, ort_check):
    x = rng.standard_normal((1, 1, 3, 4)).astype(F32)
    ort_check(single_node("Resize", {"x": x}, [("y", F32)], {"mode": "nearest"}, {"s": np.array([1, 1, 2, 3], F32)},
                          opset=10), {"x": x})
    u = rng.integers(0, 255, (1, 1, 4, 4)).astype(np.uint8)
    model = single_node("Resize", {"u": u}, [("y", np.uint8)], {"mode": "linear"},
                        {"s": np.array([1, 1, 1.5, 1.5], F32)}, opset=13, input_names=["u", "", "s"])
    ort_check(model, {"u": u})


@pytest.mark.parametrize("attrs", [m for m in MODES if m["mode"] != "nearest"])
@pytest.mark.parametrize("scales", [[1, 1, 2, 2], [1, 1, 0.6, 1.7]])
@pytest.mark.parametrize("dtype", [F32, np.float64])
def test_compiled_resize_matches_numpy_path(attrs, scales, dtype, rng):
    # Linear / cubic resizes of the last two axes run as one compiled call (jit_resize.py) over
    # resize.py's own index and weight tables: the same products and sums as the NumPy path.
    from infc.compiler.runtime import jit
    from infc.compiler.runtime.kernels import kernel_for
    from infc.compiler.runtime.kernels.common import KernelContext

    x = rng.standard_normal((2, 3, 5, 6)).astype(dtype)
    inputs = [x, None, np.array(scales, F32)]
    resize = kernel_for("", "Resize")
    compiled = resize(inputs, attrs, KernelContext(18, [None]))[0]
    with jit.disabled():
        reference = resize(inputs, attrs, KernelContext(18, [None]))[0]
    assert compiled.dtype == dtype
    np.testing.assert_allclose(compiled, reference, rtol=1e-6 if dtype == F32 else 1e-12, atol=1e-6)


BILINEAR_CASES = [
    ((1, 8, 12, 12), [1, 1, 2, 2]),    # NCHW upsampling, as tf2onnx writes TFLite's RESIZE_BILINEAR
    ((1, 8, 12, 12), [1, 1, 1.5, 1.7]),
    ((1, 12, 12, 8), [1, 2, 2, 1]),    # NHWC: onnxruntime's NhwcUpsampleBilinear
    ((2, 3, 7, 5), [1, 1, 0.6, 2]),
    ((6, 9), [2, 0.5]),
    ((1, 2, 4, 4), [1, 1, 1, 1]),      # nothing resized: the input as it is
]


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("coord", ["half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel",
                                   "tf_half_pixel_for_nn"])
@pytest.mark.parametrize("shape,scales", BILINEAR_CASES)
def test_bilinear_is_bitwise_onnxruntime(shape, scales, coord, compiled, rng, single_node):
    # After a DequantizeLinear, weights of 1/4 and 3/4 put many outputs exactly on a rounding tie of
    # the QuantizeLinear that follows: the separable taps' last-ulp differences flipped one quantum
    # in 1-2% of an int8 TFLite model's upsampled outputs. Bilinear now runs in onnxruntime's
    # arithmetic (kernels/bilinear.py): the same bits.
    from infc.compiler.runtime import jit
    from infc.compiler.verify import ort_session

    from .conftest import run_native

    x = (rng.integers(-128, 128, shape).astype(F32) + F32(3)) * F32(0.00039146)
    model = single_node("Resize", {"x": x}, [("y", F32)], {"mode": "linear", "coordinate_transformation_mode": coord},
                        {"s": np.array(scales, F32)}, opset=19, input_names=["x", "", "s"])
    expected = ort_session(model).run(None, {"x": x})[0]
    if compiled:
        got = run_native(model, {"x": x})["y"]
    else:
        with jit.disabled():
            got = run_native(model, {"x": x})["y"]
    assert got.shape == expected.shape
    mismatched = np.argwhere(got != expected)
    assert not len(mismatched), f"{len(mismatched)} of {got.size} differ, first at {mismatched[0]}"


def test_quantized_upsampling_equals_onnxruntime(rng, graph_of):
    # DequantizeLinear -> Resize (x2 bilinear) -> QuantizeLinear, tf2onnx's int8 TFLite upsampling
    from onnx import helper

    from .conftest import run_native
    from infc.compiler.verify import ort_session

    q = rng.integers(-128, 128, (1, 16, 12, 12)).astype(np.int8)
    scale, zero = np.array(0.00039146, F32), np.array(-125, np.int8)
    nodes = [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["x"]),
             helper.make_node("Resize", ["x", "", "sc"], ["y"], mode="linear"),
             helper.make_node("QuantizeLinear", ["y", "s", "z"], ["out"])]
    model = graph_of(nodes, {"q": q}, [("out", np.int8)],
                     {"s": scale, "z": zero, "sc": np.array([1, 1, 2, 2], F32)}, opset=17)
    expected = ort_session(model).run(None, {"q": q})[0]
    got = run_native(model, {"q": q})["out"]
    assert (got == expected).all(), f"{int((got != expected).sum())} of {got.size} quanta differ"


@pytest.mark.parametrize("coordinates", ["half_pixel", "pytorch_half_pixel"])
@pytest.mark.parametrize("rule", ["round_prefer_floor", "round_prefer_ceil", "floor"])
def test_nearest_source_coordinates_in_float32(coordinates, rule, rng, single_node, ort_check):
    """10 -> 14 rows: output row 10's source is 10.5 / 1.4 - 0.5, exactly 7; in float64 it came out
    just under 7 and took row 6 where onnxruntime (float32) takes row 7 (fuzz_graphs seed 3112)."""
    x = rng.standard_normal((1, 2, 10, 12)).astype(F32)
    attrs = {"mode": "nearest", "coordinate_transformation_mode": coordinates, "nearest_mode": rule}
    inits = {"roi": np.zeros(0, F32), "scales": np.zeros(0, F32), "sizes": np.array([1, 2, 14, 21], np.int64)}
    ort_check(single_node("Resize", {"x": x}, [("y", F32)], attrs, inits, opset=13), {"x": x})
