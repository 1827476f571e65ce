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


def test_resize_opset10_and_uint8(rng, single_node, ort_check):
    x = rng.standard_normal((1, 1, 3, 4)).astype(F32)
    ort_check(single_node("Resize", {"x": x}, [("y", F32)], {"mode": "nearest"}, {"s": np.array([1, 1, 2, 3], F32)},
                          opset=10), {"x": x})
    u = rng.integers(0, 255, (1, 1, 4, 4)).astype(np.uint8)
    model = single_node("Resize", {"u": u}, [("y", np.uint8)], {"mode": "linear"},
                        {"s": np.array([1, 1, 1.5, 1.5], F32)}, opset=13, input_names=["u", "", "s"])
    ort_check(model, {"u": u})
