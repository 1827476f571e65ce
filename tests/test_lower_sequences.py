"""A sequence carried from SequenceEmpty through a Loop to ConcatFromSequence, with native steps
(Shape, Gather) between them: the sequence stays inside one onnxruntime island (the executor's
values are arrays), and the plan matches onnxruntime."""

import numpy as np
import onnx
from onnx import TensorProto, helper

from infc.compiler.build import BuildOptions, build
from infc.compiler.graph import import_graph
from infc.compiler.lower import ISLAND_OP, lower_graph
from infc.compiler.runtime.kernels import has_kernel
from infc.compiler.runtime.session import PlanSession
from infc.compiler.verify import compare_outputs, ort_session

F = TensorProto.FLOAT


def _loop_over_rows() -> onnx.ModelProto:
    """y[t] = 2 * x[t], collected row by row in a sequence, then Relu."""
    body = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["row"], axis=0),
         helper.make_node("Mul", ["row", "two"], ["doubled"]),
         helper.make_node("SequenceInsert", ["rows_in", "doubled"], ["rows_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_sequence_value_info("rows_in", F, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_sequence_value_info("rows_out", F, None)],
        [helper.make_tensor("two", F, [], [2.0])])
    nodes = [helper.make_node("SequenceEmpty", [], ["rows0"], dtype=F),
             helper.make_node("Shape", ["x"], ["x_shape"]),
             helper.make_node("Gather", ["x_shape", "zero"], ["num_rows"], axis=0),
             helper.make_node("Loop", ["num_rows", "true", "rows0"], ["rows"], body=body),
             helper.make_node("ConcatFromSequence", ["rows"], ["stacked"], axis=0, new_axis=1),
             helper.make_node("Relu", ["stacked"], ["y"])]
    graph = helper.make_graph(nodes, "loop_rows", [helper.make_tensor_value_info("x", F, ["t", 4])],
                              [helper.make_tensor_value_info("y", F, ["t", 4])],
                              [helper.make_tensor("zero", TensorProto.INT64, [], [0]),
                               helper.make_tensor("true", TensorProto.BOOL, [], [True])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def test_a_sequence_never_crosses_an_island_boundary():
    program = lower_graph(import_graph(onnx.shape_inference.infer_shapes(_loop_over_rows())), has_kernel)
    islands = [s for s in program.steps if s["op"] == ISLAND_OP]
    assert len(islands) == 1 and {"SequenceEmpty", "Loop", "ConcatFromSequence"} <= set(islands[0]["ops"])
    assert "rows" not in islands[0]["outputs"] and "rows0" not in islands[0]["outputs"]


def test_the_plan_matches_onnxruntime(tmp_path):
    model = _loop_over_rows()
    onnx.save(model, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text("inputs: {x: {min: [1, 4], opt: [6, 4], max: [16, 4]}}\n")
    build(str(tmp_path / "m.onnx"), str(tmp_path / "p.yaml"), str(tmp_path / "m.plan"),
          BuildOptions(use_cache=False, show_progress=False))
    session = PlanSession(tmp_path / "m.plan")
    for rows in (1, 6, 11):
        feeds = {"x": np.random.default_rng(rows).standard_normal((rows, 4)).astype(np.float32)}
        actual = session.run(session.check_feeds(feeds, "test"))["y"]
        expected = ort_session(model).run(["y"], feeds)
        assert compare_outputs(["y"], expected, [actual])[0].max_rel_diff == 0
