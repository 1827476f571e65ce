import numpy as np
import pytest

F32 = np.float32
I64 = np.int64


def _x(rng, shape=(2, 3, 4)):
    return rng.standard_normal(shape).astype(F32)


@pytest.mark.parametrize("shape", [[0, -1], [6, 4], [-1], [2, 0, 2, 2]])
def test_reshape(shape, rng, single_node, ort_check):
    x = _x(rng)
    ort_check(single_node("Reshape", {"x": x}, [("y", F32)], initializers={"s": np.array(shape, I64)}, opset=14), {"x": x})


def test_transpose(rng, single_node, ort_check):
    x = _x(rng)
    ort_check(single_node("Transpose", {"x": x}, [("y", F32)], {"perm": [2, 0, 1]}), {"x": x})
    ort_check(single_node("Transpose", {"x": x}, [("y", F32)]), {"x": x})


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_unsqueeze_forms(opset, rng, single_node, ort_check):
    x = rng.standard_normal((1, 3, 1, 4)).astype(F32)
    if opset < 13:
        ort_check(single_node("Squeeze", {"x": x}, [("y", F32)], {"axes": [0, -2]}, opset=opset), {"x": x})
        ort_check(single_node("Unsqueeze", {"x": x}, [("y", F32)], {"axes": [0, -1]}, opset=opset), {"x": x})
    else:
        ort_check(single_node("Squeeze", {"x": x}, [("y", F32)], initializers={"a": np.array([2], I64)}, opset=opset), {"x": x})
        ort_check(single_node("Squeeze", {"x": x}, [("y", F32)], opset=opset), {"x": x})
        ort_check(single_node("Unsqueeze", {"x": x}, [("y", F32)], initializers={"a": np.array([-1, 1], I64)},
                              opset=opset), {"x": x})


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_flatten(axis, rng, single_node, ort_check):
    x = _x(rng)
    ort_check(single_node("Flatten", {"x": x}, [("y", F32)], {"axis": axis}, opset=13), {"x": x})


def test_concat(rng, single_node, ort_check):
    a, b = _x(rng, (2, 3)), _x(rng, (2, 5))
    ort_check(single_node("Concat", {"a": a, "b": b}, [("y", F32)], {"axis": -1}), {"a": a, "b": b})


@pytest.mark.parametrize("form", ["sizes", "equal", "num_outputs", "attribute"])
def test_split_forms(form, rng, single_node, ort_check):
    x = _x(rng, (7, 4))
    if form == "sizes":
        model = single_node("Split", {"x": x}, [("a", F32), ("b", F32)], {"axis": 0}, {"s": np.array([3, 4], I64)}, opset=13)
    elif form == "equal":
        x = _x(rng, (6, 4))
        model = single_node("Split", {"x": x}, [("a", F32), ("b", F32), ("c", F32)], opset=13)
    elif form == "num_outputs":
        model = single_node("Split", {"x": x}, [("a", F32), ("b", F32), ("c", F32)], {"num_outputs": 3}, opset=18)
    else:
        model = single_node("Split", {"x": x}, [("a", F32), ("b", F32)], {"axis": 0, "split": [2, 5]}, opset=11)
    ort_check(model, {"x": x})


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([0, 1], [2, 3], [0, 1], [1, 1]), ([-1], [-1000], [2], [-1]), ([1], [100], [-1], [2]), ([3], [0], [1], [-2]),
    ([0], [-1], [0], [1]), ([5], [10], [1], [1])])
def test_slice(starts, ends, axes, steps, rng, single_node, ort_check):
    x = _x(rng, (3, 5, 6))
    inits = {"s": np.array(starts, I64), "e": np.array(ends, I64), "a": np.array(axes, I64), "t": np.array(steps, I64)}
    ort_check(single_node("Slice", {"x": x}, [("y", F32)], initializers=inits, opset=13), {"x": x})


def test_slice_opset1_attributes(rng, single_node, ort_check):
    x = _x(rng, (3, 5))
    ort_check(single_node("Slice", {"x": x}, [("y", F32)], {"starts": [1], "ends": [4], "axes": [1]}, opset=9), {"x": x})


def test_expand_tile(rng, single_node, ort_check):
    x = _x(rng, (3, 1))
    ort_check(single_node("Expand", {"x": x}, [("y", F32)], initializers={"s": np.array([2, 3, 4], I64)}), {"x": x})
    ort_check(single_node("Tile", {"x": x}, [("y", F32)], initializers={"r": np.array([2, 3], I64)}), {"x": x})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_modes(mode, rng, single_node, ort_check):
    x = _x(rng, (1, 2, 4, 5))
    pads = np.array([0, 0, 1, 2, 0, 0, 2, 1], I64)
    inits = {"p": pads, "v": np.array(1.5, F32)} if mode == "constant" else {"p": pads}
    ort_check(single_node("Pad", {"x": x}, [("y", F32)], {"mode": mode}, inits, opset=19), {"x": x})


def test_pad_negative_and_axes(rng, single_node, ort_check):
    x = _x(rng, (3, 5))
    model = single_node("Pad", {"x": x}, [("y", F32)], input_names=["x", "p", "", "a"],
                        initializers={"p": np.array([-1, 2], I64), "a": np.array([1], I64)}, opset=18)
    ort_check(model, {"x": x})


def test_shape_size_constant_of_shape(rng, single_node, ort_check):
    x = _x(rng)
    ort_check(single_node("Shape", {"x": x}, [("y", I64)], {"start": 1, "end": -0}, opset=15), {"x": x})
    ort_check(single_node("Shape", {"x": x}, [("y", I64)], {"start": -2}, opset=15), {"x": x})
    ort_check(single_node("Size", {"x": x}, [("y", I64)]), {"x": x})
    s = np.array([2, 3], I64)
    from onnx import helper, TensorProto
    value = helper.make_tensor("v", TensorProto.INT32, [1], [7])
    ort_check(single_node("ConstantOfShape", {"s": s}, [("y", np.int32)], {"value": value}), {"s": s})
    ort_check(single_node("ConstantOfShape", {"s": s}, [("y", F32)]), {"s": s})


@pytest.mark.parametrize("dtype,args", [(F32, (0.5, 3.0, 0.7)), (I64, (10, -3, -4)), (np.int32, (1, 1, 1))])
def test_range(dtype, args, single_node, ort_check):
    feeds = {n: np.array(v, dtype) for n, v in zip("sld", args)}
    ort_check(single_node("Range", feeds, [("y", dtype)]), feeds)


def test_eye_like_trilu(rng, single_node, ort_check):
    x = _x(rng, (3, 5))
    ort_check(single_node("EyeLike", {"x": x}, [("y", F32)], {"k": 1}), {"x": x})
    x3 = _x(rng, (2, 4, 4))
    for upper in (0, 1):
        model = single_node("Trilu", {"x": x3}, [("y", F32)], {"upper": upper}, {"k": np.array(-1, I64)}, opset=14)
        ort_check(model, {"x": x3})


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_and_back(mode, rng, single_node, ort_check):
    x = _x(rng, (1, 8, 2, 3))
    ort_check(single_node("DepthToSpace", {"x": x}, [("y", F32)], {"blocksize": 2, "mode": mode}, opset=13), {"x": x})
    y = _x(rng, (1, 2, 4, 6))
    ort_check(single_node("SpaceToDepth", {"x": y}, [("z", F32)], {"blocksize": 2}, opset=13), {"x": y})


PAD_GEOMETRIES = [  # x shape, pads
    ((1, 576), [0, 64, 0, 64]),  # a VAD's STFT padding: reflect along the samples
    ((2, 3, 7), [0, 1, 3, 0, 2, 0]),
    ((2, 2, 4, 5), [1, 0, 2, 2, 0, 1, 0, 3]),
    ((4,), [3, 2]),
]


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("x_shape,pads", PAD_GEOMETRIES)
def test_pad_geometries(mode, x_shape, pads, rng, single_node, ort_check):
    x = _x(rng, x_shape)
    inits = {"p": np.array(pads, I64)}
    ort_check(single_node("Pad", {"x": x}, [("y", F32)], {"mode": mode}, inits, opset=19), {"x": x})


def test_pad_keeps_integer_values_and_dtype(single_node, ort_check):
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    model = single_node("Pad", {"x": x}, [("y", np.int32)], {"mode": "constant"},
                        {"p": np.array([1, 0, 0, 2], I64), "v": np.array(-7, np.int32)}, opset=19)
    ort_check(model, {"x": x})


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
def test_pad_source_positions_follow_numpy_past_the_input(mode):
    # pads longer than the axis (ONNX leaves some undefined; NumPy reflects again and again)
    from infc.compiler.runtime.kernels.shape import _pad_source

    for size in (1, 2, 3, 5):
        for begin, end in ((0, 0), (1, 0), (0, 4), (7, 3), (11, 12)):
            if mode == "reflect" and size == 1:
                continue  # np.pad repeats the one value there too; ONNX does not define it
            expected = np.pad(np.arange(size), (begin, end), mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode])
            np.testing.assert_array_equal(_pad_source(mode, size, begin, end), expected)
