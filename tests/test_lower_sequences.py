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


def test_native_nodes_before_the_loop_stay_native():
    """SequenceEmpty has no inputs, so a toposort lists it first; the island then took every node up
    to ConcatFromSequence (FastSpeech2's whole encoder ran in onnxruntime). Sunk to just before
    its Loop, only the sequence's own nodes form the island."""
    model = _loop_over_rows()
    graph = model.graph
    encoder = [helper.make_node("Relu", ["x"], ["h1"]), helper.make_node("Mul", ["h1", "two_outer"], ["h2"]),
               helper.make_node("Shape", ["h2"], ["h_shape"]), helper.make_node("Gather", ["h_shape", "zero"], ["num_h"], axis=0)]
    nodes = list(graph.node)
    loop = next(n for n in nodes if n.op_type == "Loop")
    loop.input[0] = "num_h"
    del graph.node[:]
    graph.node.extend([nodes[0], *encoder, *nodes[1:]])  # SequenceEmpty first, as a toposort puts it
    graph.initializer.append(helper.make_tensor("two_outer", F, [], [2.0]))
    program = lower_graph(import_graph(onnx.shape_inference.infer_shapes(model)), has_kernel)
    islands = [s for s in program.steps if s["op"] == ISLAND_OP]
    assert len(islands) == 1
    assert set(islands[0]["ops"]) == {"SequenceEmpty", "Loop", "ConcatFromSequence"}
    assert {"Shape", "Gather"} <= {s["op"] for s in program.steps}  # Relu and Mul fuse into one step
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    from tests.runtime.conftest import executor_for  # noqa: PLC0415
    got = executor_for(model, allow_fallback=True).run({"x": x})["y"]
    np.testing.assert_allclose(got, ort_session(model).run(["y"], {"x": x})[0], rtol=1e-6)


def test_a_loop_body_reading_an_outer_sequence_closes_the_island():
    """FastSpeech2's length regulator: SplitToSequence rows read by SequenceAt inside the Loop body
    (from the outer scope). That read counts as the sequence's reader, so the island ends at
    ConcatFromSequence and the decoder after it stays native (it stayed open to the graph's end)."""
    body = helper.make_graph(
        [helper.make_node("SequenceAt", ["rows_outer", "i"], ["row"]),
         helper.make_node("Mul", ["row", "two"], ["doubled"]),
         helper.make_node("SequenceInsert", ["acc_in", "doubled"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_sequence_value_info("acc_in", F, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_sequence_value_info("acc_out", F, None)],
        [helper.make_tensor("two", F, [], [2.0])])
    nodes = [helper.make_node("Relu", ["x"], ["h"]),
             helper.make_node("SplitToSequence", ["h"], ["rows_outer"], axis=0, keepdims=0),
             helper.make_node("SequenceEmpty", [], ["acc0"], dtype=F),
             helper.make_node("Shape", ["h"], ["h_shape"]),
             helper.make_node("Gather", ["h_shape", "zero"], ["num_rows"], axis=0),
             helper.make_node("Loop", ["num_rows", "true", "acc0"], ["acc"], body=body),
             helper.make_node("ConcatFromSequence", ["acc"], ["stacked"], axis=0, new_axis=1),
             helper.make_node("Sigmoid", ["stacked"], ["s"]),
             helper.make_node("Shape", ["s"], ["s_shape"]),
             helper.make_node("Reshape", ["s", "flat"], ["y"])]
    graph = helper.make_graph(nodes, "outer_rows", [helper.make_tensor_value_info("x", F, ["t", 4])],
                              [helper.make_tensor_value_info("y", F, ["n"])],
                              [helper.make_tensor("zero", TensorProto.INT64, [], [0]),
                               helper.make_tensor("true", TensorProto.BOOL, [], [True]),
                               helper.make_tensor("flat", TensorProto.INT64, [1], [-1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    program = lower_graph(import_graph(onnx.shape_inference.infer_shapes(model)), has_kernel)
    islands = [s for s in program.steps if s["op"] == ISLAND_OP]
    assert len(islands) == 1
    assert set(islands[0]["ops"]) == {"SplitToSequence", "SequenceEmpty", "Loop", "ConcatFromSequence"}
    assert program.steps[-1]["op"] != ISLAND_OP  # what follows ConcatFromSequence is native
    x = np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32)
    from tests.runtime.conftest import executor_for  # noqa: PLC0415
    got = executor_for(model, allow_fallback=True).run({"x": x})["y"]
    np.testing.assert_allclose(got, ort_session(model).run(["y"], {"x": x})[0], rtol=1e-6)
