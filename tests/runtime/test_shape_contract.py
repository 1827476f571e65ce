"""The messages runtime/shape_contract.py reads as "the fed sizes do not fit the model" are the ones
infc's kernels, NumPy and onnxruntime really raise (a NumPy or onnxruntime upgrade that rewords
them shows up here, not as exit 1 on a user's feeds)."""

import numpy as np
import pytest
from onnx import TensorProto, helper

from infc.compiler.runtime.kernels.common import broadcast_shape
from infc.compiler.runtime.shape_contract import contradicts_shapes
from infc.compiler.verify import ort_session


def _raised(fn) -> BaseException:
    with pytest.raises(Exception) as info:
        fn()
    return info.value


def test_broadcast_and_reshape_failures_contradict_shapes():
    assert contradicts_shapes(_raised(lambda: broadcast_shape((1, 4, 9, 9), (1, 4, 8, 8))))
    assert contradicts_shapes(_raised(lambda: np.add(np.ones((9, 9)), np.ones((8, 8)))))
    assert contradicts_shapes(_raised(lambda: np.ones(81).reshape(8, 8)))
    assert contradicts_shapes(_raised(lambda: np.concatenate([np.ones((1, 2, 21)), np.ones((1, 2, 22))], 1)))
    assert contradicts_shapes(_raised(lambda: np.matmul(np.ones((3, 4)), np.ones((5, 2)))))


def _ort_failure(op, shapes, attrs=None) -> BaseException:
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [f"d{k}_{j}" for j in range(len(shape))])
              for k, shape in enumerate(shapes)]
    node = helper.make_node(op, [i.name for i in inputs], ["y"], **(attrs or {}))
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = {i.name: np.ones(shape, np.float32) for i, shape in zip(inputs, shapes)}
    return _raised(lambda: ort_session(model).run(None, feeds))


@pytest.mark.parametrize("op,shapes,attrs", [
    ("Concat", [(1, 2, 21), (1, 2, 22)], {"axis": 1}),  # a UNet's skip at an odd size
    ("MatMul", [(3, 4), (5, 2)], None),
    ("MatMul", [(2, 3, 4), (3, 4, 5)], None),
])
def test_onnxruntime_concat_and_matmul_failures_contradict_shapes(op, shapes, attrs):
    assert contradicts_shapes(_ort_failure(op, shapes, attrs))


@pytest.mark.parametrize("op", ["Add", "Reshape"])
def test_onnxruntime_failures_contradict_shapes(op):
    if op == "Add":
        inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n"]),
                  helper.make_tensor_value_info("b", TensorProto.FLOAT, ["m"])]
        feeds = {"a": np.ones(9, np.float32), "b": np.ones(8, np.float32)}
        node = helper.make_node("Add", ["a", "b"], ["y"])
    else:
        inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n"]),
                  helper.make_tensor_value_info("b", TensorProto.INT64, [2])]
        feeds = {"a": np.ones(81, np.float32), "b": np.array([8, 8], np.int64)}
        node = helper.make_node("Reshape", ["a", "b"], ["y"])
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert contradicts_shapes(_raised(lambda: ort_session(model).run(None, feeds)))


def test_onnxruntime_reflect_pad_wider_than_its_axis_contradicts_shapes():
    """EnCodec's decoder mirrors 6 frames of its input: fed 2 codes, onnxruntime refuses the pad."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "T"])]
    pads = helper.make_tensor("pads", TensorProto.INT64, [6], [0, 0, 6, 0, 0, 0])
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [pads])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert contradicts_shapes(_raised(lambda: ort_session(model).run(None, {"x": np.ones((1, 4, 2), np.float32)})))


def test_other_failures_do_not():
    assert not contradicts_shapes(ValueError("axis 4 out of range for rank 3"))
    assert not contradicts_shapes(IndexError("index 10 is out of bounds for axis 0 with size 4"))


def test_a_run_past_the_profile_that_the_model_cannot_take_is_bad_input(tmp_path):
    """A position table of 4 rows read at positions 0..S-1: the build ran S <= 4 only; at S = 6 the
    model itself fails (onnxruntime too), which `infc run` reports as the input it is (exit 2)."""
    import onnx
    from onnx import numpy_helper

    from infc.compiler.build import BuildOptions, build
    from infc.compiler.errors import BadInput
    from infc.compiler.runtime.session import PlanSession

    table = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "table")
    scalars = [numpy_helper.from_array(np.array(v, dtype=np.int64), n) for n, v in (("zero", 0), ("one", 1))]
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "one"], ["length"]),
             helper.make_node("Range", ["zero", "length", "one"], ["positions"]),
             helper.make_node("Gather", ["table", "positions"], ["rows"]),
             helper.make_node("Unsqueeze", ["x", "axes"], ["x3"]), helper.make_node("Add", ["x3", "rows"], ["y"])]
    axes = numpy_helper.from_array(np.array([2], dtype=np.int64), "axes")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "S", 3])], [table, axes, *scalars])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text("inputs:\n  x: {min: [1, 1], opt: [1, 2], max: [1, 4]}\n")
    build(str(tmp_path / "m.onnx"), str(tmp_path / "p.yaml"), str(tmp_path / "m.plan"),
          BuildOptions(target="cpu", use_cache=False, show_progress=False))
    session = PlanSession(tmp_path / "m.plan")
    inside = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(session.run({"x": inside})["y"], ort_session(model).run(["y"], {"x": inside})[0])
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime's own error type
        ort_session(model).run(["y"], {"x": np.ones((1, 6), np.float32)})
    with pytest.raises(BadInput, match=r"input 'x' shape \[1, 6\] is outside the profile \[\[1, 1\] \.\. \[1, 4\]\]"):
        session.run({"x": np.ones((1, 6), np.float32)})
