"""One-line reasons for `error:` messages (compiler/errors.py)."""

from infc.compiler.errors import error_reason

RESHAPE_FAILURE = ("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Reshape node. "
                   "Name:'/m/Reshape_1' Status Message: /onnxruntime_src/onnxruntime/core/providers/cpu/tensor/"
                   "reshape_helper.h:91 onnxruntime::ReshapeHelper::ReshapeHelper(const onnxruntime::TensorShape&, "
                   "onnxruntime::TensorShapeVector&, bool) input_shape_size == requested_shape_size was false. The input "
                   "tensor cannot be reshaped to the requested shape. Input shape:{0,64}, requested shape:{1,64,64}\nmore")


def test_onnxruntime_source_locations_are_dropped_so_the_shapes_fit():
    reason = error_reason(RuntimeError(RESHAPE_FAILURE), limit=300)
    assert reason.startswith("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Reshape node.")
    assert "onnxruntime_src" not in reason and "ReshapeHelper" not in reason
    assert reason.endswith("Input shape:{0,64}, requested shape:{1,64,64}")


def test_other_messages_keep_their_first_line():
    assert error_reason(ValueError("axis 4 out of range\nfor rank 3")) == "axis 4 out of range"
    assert error_reason(ValueError("")) == "ValueError"
