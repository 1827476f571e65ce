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


def test_other_failures_do_not():
    assert not contradicts_shapes(ValueError("axis 4 out of range for rank 3"))
    assert not contradicts_shapes(IndexError("index 10 is out of bounds for axis 0 with size 4"))
