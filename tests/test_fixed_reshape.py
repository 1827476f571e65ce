"""A batch dim edited to a dim_param over a graph whose Reshapes have the batch of 1 baked in
(tf2onnx's TFLite graphs: mediapipe's face landmarks, pose landmarks): at batch 2 onnxruntime fails
too, and the error names the Reshape and its constant shape instead of asking for --inputs."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from infc.compiler.build import BuildOptions, build
from infc.compiler.errors import BadInput


def _fixed_batch_model(path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["y"], name="flatten_1")],
        "fixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 12])],
        [numpy_helper.from_array(np.array([1, 12], np.int64), "shape")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def test_a_reshape_to_a_constant_shape_is_named(tmp_path):
    model, profile = tmp_path / "m.onnx", tmp_path / "p.yaml"
    _fixed_batch_model(model)
    profile.write_text("inputs:\n  x: {min: [1, 4, 3], opt: [2, 4, 3], max: [4, 4, 3]}\n")
    with pytest.raises(BadInput, match=r"Reshape 'flatten_1' has the constant target shape \[1, 12\], fixed when the "
                                       r"model was exported: profile only the shapes it was exported for"):
        build(str(model), str(profile), str(tmp_path / "p.plan"), BuildOptions(use_cache=False, show_progress=False))
    assert not (tmp_path / "p.plan").exists()
    profile.write_text("inputs:\n  x: [1, 4, 3]\n")  # the shapes it was exported for
    build(str(model), str(profile), str(tmp_path / "p.plan"), BuildOptions(use_cache=False, show_progress=False))
    assert (tmp_path / "p.plan").exists()


def test_a_reshape_half_fixed_at_export_says_the_shapes_not_the_values(tmp_path):
    """A TorchScript trace's Reshape target mixes a live dim with lengths fixed at export (a
    TransformerEncoder's heads reshape: [T, B * heads, head_dim] with T traced): no inputs make it run
    at other lengths, so the error says so (it asked for representative inputs) and keeps the shapes."""
    model, profile = tmp_path / "m.onnx", tmp_path / "p.yaml"
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "zero"], ["batch"]),
             helper.make_node("Concat", ["batch", "traced"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"], name="heads")]
    graph = helper.make_graph(nodes, "half_fixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, 4])],
                              [numpy_helper.from_array(np.array([0], np.int64), "zero"),
                               numpy_helper.from_array(np.array([2, 4], np.int64), "traced")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), model)
    profile.write_text("inputs:\n  x: {min: [1, 6], opt: [2, 8], max: [4, 8]}\n")
    with pytest.raises(BadInput, match=r"requested shape:\{1,2,4\}\); the model does not take these shapes: profile "
                                       r"only shapes it runs at"):
        build(str(model), str(profile), str(tmp_path / "p.plan"), BuildOptions(use_cache=False, show_progress=False))
