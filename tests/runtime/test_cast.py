import numpy as np
import pytest
from onnx import TensorProto

CODES = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.float64: TensorProto.DOUBLE,
         np.int64: TensorProto.INT64, np.int32: TensorProto.INT32, np.uint8: TensorProto.UINT8,
         np.int8: TensorProto.INT8, bool: TensorProto.BOOL}


@pytest.mark.parametrize("source", [np.float32, np.float64, np.int64, np.int32, bool])
@pytest.mark.parametrize("target", [np.float32, np.float16, np.int64, np.int32, np.uint8, bool])
def test_cast_between_numeric_types(source, target, single_node, ort_check):
    x = np.array([[0, 1, 2.7, -3.2, 100]], dtype=np.float64)
    if np.dtype(source).kind in "iu":
        x = np.trunc(x)
    x = np.abs(x) if np.dtype(target).kind == "u" else x
    x = x.astype(source)
    ort_check(single_node("Cast", {"x": x}, [("y", target)], {"to": CODES[target]}, opset=13), {"x": x})


def test_cast_like(single_node, ort_check):
    x = np.array([1.5, -2.5], dtype=np.float32)
    model = single_node("CastLike", {"x": x}, [("y", np.int32)], initializers={"t": np.zeros(1, np.int32)}, opset=15)
    ort_check(model, {"x": x})


def test_cast_from_string(single_node, ort_check):
    x = np.array(["1.5", "-2", "NaN"], dtype=object)
    ort_check(single_node("Cast", {"x": x}, [("y", np.float32)], {"to": TensorProto.FLOAT}, opset=13), {"x": x})
