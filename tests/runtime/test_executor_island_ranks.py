"""compiler/runtime/executor.py `_island_runner`: an island input of no known rank takes the rank of
the first array it is fed, so onnxruntime can size a Scan's body (fuzz_graphs seed 130)."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from infc.compiler.verify import ort_session

from .conftest import executor_for


def _float(name, dims=None):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def _loop_rmsnorm_scan():
    """A Loop stacks one state per step of x's axis 1 (its stacked output has no rank onnx infers),
    a native Transpose (a declared output: how onnxruntime knows the rank) and RMSNormalization follow,
    then a Scan island reads the RMSNormalization: a value of a known type and no rank to the plan."""
    loop_body = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["x_i"], axis=1),
         helper.make_node("Mul", ["h_in", "half"], ["h_half"]),
         helper.make_node("Add", ["h_half", "x_i"], ["h_out"]),
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
        helper.make_node("RMSNormalization", ["h_steps", "gamma"], ["h_tanh"], axis=-1),
        helper.make_node("Gather", ["h_tanh", "zero"], ["s_first"], axis=1),
        helper.make_node("Mul", ["s_first", "nought"], ["s0"]),
        helper.make_node("Scan", ["s0", "h_tanh"], ["s_last", "ys"], body=scan_body, num_scan_inputs=1,
                         scan_input_axes=[1], scan_output_axes=[1]),
    ]
    consts = [numpy_helper.from_array(np.array(v, dtype), n) for n, v, dtype in
              (("one", 1, np.int64), ("zero", 0, np.int64), ("half", 0.5, np.float32), ("nought", 0.0, np.float32),
               ("true", True, np.bool_), ("gamma", np.ones(6), np.float32))]
    graph = helper.make_graph(nodes, "loop_scan", [_float("x", ["batch", 5, 6])], [_float("ys", ["batch", 5, 6]), _float("h_steps", ["batch", 5, 6])],
                              consts)
    # typed, of no shape: as onnx's inference leaves a value after a Loop's stacked output
    graph.value_info.extend([_float("h_tanh"), _float("s0")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=8)


def test_a_scan_island_fed_a_value_of_no_known_rank_runs():
    model = _loop_rmsnorm_scan()
    executor = executor_for(model, allow_fallback=True)
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 5, 6)).astype(np.float32)
        want = ort_session(model).run(["ys"], {"x": x})[0]
        got = executor.run({"x": x})["ys"]  # failed: 'Subgraph must have the shape set for all outputs'
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
