"""compiler/passes/fold/shape_inference.py: where onnx infers no shape for a graph output, the
model's own declaration of it stays in the optimized model; elements taken out of a sequence do not
share onnx's placeholder symbol for their unknown dims."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from infc.compiler.optimize import optimize_model
from infc.compiler.verify import ort_session


def _float(name, dims=None):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def _loop_then_scan() -> onnx.ModelProto:
    """A Loop stacking a state per step along x's axis 1 (onnx infers no shape for its scan output),
    transposed back and declared [batch, 7, 24] as a graph output, then read by a Scan: onnxruntime
    sizes the Scan's body from its inputs' shapes, so without the declaration it cannot run it."""
    loop_body = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["x_i"], axis=1),
         helper.make_node("Mul", ["h_in", "half"], ["h_half"]),
         helper.make_node("Add", ["h_half", "x_i"], ["h_sum"]),
         helper.make_node("Tanh", ["h_sum"], ["h_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["h_out"], ["h_scan"])],
        "loop_body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                      helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []), _float("h_in")],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), _float("h_out"), _float("h_scan")])
    scan_body = helper.make_graph(
        [helper.make_node("Mul", ["s_in", "half"], ["s_half"]),
         helper.make_node("Add", ["s_half", "x_t"], ["s_sum"]),
         helper.make_node("Tanh", ["s_sum"], ["s_out"]),
         helper.make_node("Sigmoid", ["s_out"], ["y_t"])],
        "scan_body", [_float("s_in"), _float("x_t")], [_float("s_out"), _float("y_t")])
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Gather", ["x_shape", "one"], ["trips"], axis=0),
        helper.make_node("Gather", ["x", "zero"], ["x_0"], axis=1),
        helper.make_node("Mul", ["x_0", "nought"], ["h0"]),
        helper.make_node("Loop", ["trips", "true", "h0"], ["h_last", "h_stacked"], body=loop_body),
        helper.make_node("Transpose", ["h_stacked"], ["h_steps"], perm=[1, 0, 2]),
        helper.make_node("Gather", ["h_steps", "zero"], ["s_first"], axis=1),
        helper.make_node("Mul", ["s_first", "nought"], ["s0"]),
        helper.make_node("Scan", ["s0", "h_steps"], ["s_last", "ys"], body=scan_body, num_scan_inputs=1,
                         scan_input_axes=[1], scan_output_axes=[1]),
    ]
    consts = [numpy_helper.from_array(np.array(v, dtype), n) for n, v, dtype in
              (("one", 1, np.int64), ("zero", 0, np.int64), ("half", 0.5, np.float32), ("nought", 0.0, np.float32),
               ("true", True, np.bool_))]
    graph = helper.make_graph(nodes, "loop_scan", [_float("x", ["batch", 7, 24])],
                              [_float("ys", ["batch", 7, 24]), _float("h_steps", ["batch", 7, 24])], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_declared_output_shapes_stay_where_onnx_infers_none():
    model = _loop_then_scan()
    optimized = optimize_model(model).model
    declared = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in optimized.graph.output}
    assert declared["h_steps"] == ["batch", 7, 24]
    x = np.random.default_rng(0).standard_normal((2, 7, 24)).astype(np.float32)
    want = ort_session(model).run(None, {"x": x})
    got = ort_session(optimized, optimize=True).run(None, {"x": x})  # failed: the Scan's body had no shapes
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _split_parts_rotated() -> onnx.ModelProto:
    """x split into a sequence of two parts of different widths (3 and 5), taken out, one through a
    Relu, and concatenated the other way round: onnx gives both SequenceAt outputs the sequence's
    element type, whose unknown width is one placeholder symbol for both."""
    nodes = [
        helper.make_node("SplitToSequence", ["x", "sizes"], ["parts"], axis=2),
        helper.make_node("SequenceAt", ["parts", "first"], ["head"]),
        helper.make_node("SequenceAt", ["parts", "last"], ["tail"]),
        helper.make_node("Relu", ["head"], ["head_relu"]),
        helper.make_node("SequenceConstruct", ["tail", "head_relu"], ["rotated"]),
        helper.make_node("ConcatFromSequence", ["rotated"], ["joined"], axis=2),
        helper.make_node("MatMul", ["joined", "w"], ["y"]),
    ]
    consts = [numpy_helper.from_array(np.array([3, 5], np.int64), "sizes"),
              numpy_helper.from_array(np.array(0, np.int64), "first"), numpy_helper.from_array(np.array(-1, np.int64), "last"),
              numpy_helper.from_array(np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32), "w")]
    graph = helper.make_graph(nodes, "parts", [_float("x", ["batch", 7, 8])], [_float("y", ["batch", 7, 4])], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_sequence_elements_of_different_sizes_are_not_declared_equal():
    model = _split_parts_rotated()
    optimized = optimize_model(model).model
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in optimized.graph.value_info}
    head, tail = dims.get("head", [0])[-1], dims.get("tail", [0])[-1]
    assert not (head and head == tail), (head, tail)  # 3 and 5 wide: no one symbol for both
    x = np.random.default_rng(0).standard_normal((2, 7, 8)).astype(np.float32)
    want = ort_session(model).run(None, {"x": x})[0]
    got = ort_session(optimized, optimize=True).run(None, {"x": x})[0]  # failed: one buffer planned for both parts
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _empty_slice_added_back(opset: int) -> onnx.ModelProto:
    """x flattened to [batch, 4*h*w], an empty slice of its columns (0:0) summed to [batch, 1] and
    added back to the flattened x (fuzz_graphs --forms old seed 983, reduced)."""
    starts_ends = [numpy_helper.from_array(np.array([0], np.int64), "zero"), numpy_helper.from_array(np.array([1], np.int64), "axis")]
    nodes = [helper.make_node("Flatten", ["x"], ["flat"]),
             helper.make_node("Slice", ["flat", "zero", "zero", "axis"], ["empty"]),
             helper.make_node("ReduceSum", ["empty"], ["sums"], axes=[1], keepdims=1),
             helper.make_node("Add", ["flat", "sums"], ["y"]),
             helper.make_node("Slice", ["flat", "zero", "end", "axis"], ["whole"]),
             helper.make_node("Slice", ["flat", "minus_one", "start", "axis", "minus_one"], ["reversed"])]
    consts = starts_ends + [numpy_helper.from_array(np.array([2**63 - 1], np.int64), "end"),
                            numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
                            numpy_helper.from_array(np.array([-(2**63)], np.int64), "start")]
    graph = helper.make_graph(nodes, "empty_slice", [_float("x", ["batch", 4, "height", "width"])],
                              [_float("y"), _float("whole"), _float("reversed"), _float("empty")], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)


def test_an_empty_slice_is_not_declared_as_long_as_its_input():
    """onnx labelled the empty slice with its input's unk__0 and onnxruntime, reading the label,
    planned one buffer for the empty slice and the sum ('Shape mismatch attempting to re-use buffer')."""
    from infc.compiler.graph import import_graph
    from infc.compiler.passes.fold.shape_inference import infer_shapes

    model = _empty_slice_added_back(10)
    shapes = infer_shapes(import_graph(model))
    assert shapes["empty"][1] == ["batch", None]  # was ['batch', 'unk__0'], flat's own label
    assert shapes["whole"][1] == shapes["flat"][1] == shapes["reversed"][1]  # taken whole: the label stays
    optimized = optimize_model(model).model
    labels = [d.dim_param for v in optimized.graph.value_info for d in v.type.tensor_type.shape.dim]
    assert not [label for label in labels if label.startswith("unk__")]
    x = np.random.default_rng(0).standard_normal((3, 4, 6, 6)).astype(np.float32)
    want = ort_session(model).run(None, {"x": x})
    got = ort_session(optimized, optimize=True).run(None, {"x": x})  # failed before
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
