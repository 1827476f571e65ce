"""The CPU executor drops Transpose pairs that cancel and runs Reshape chains as one step
(runtime/kernels/view_fold.py): on the layout chains around a paged decoder's attention the results
are onnxruntime's, values read twice or shown as outputs stay, and a non-cancelling pair stays."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from infc.compiler.graph import import_graph
from infc.compiler.lower import lower_graph
from infc.compiler.runtime.executor import Executor
from infc.compiler.runtime.kernels import has_kernel
from infc.compiler.runtime.kernels.view_fold import DOMAIN, OP, fold_views

HEADS, HEAD_DIM = 3, 8
PERM = [0, 2, 1, 3]


def _model() -> onnx.ModelProto:
    """rotary-like q path: x [1, T, N*H] -> Reshape [0, 0, N, H] -> Transpose -> Transpose -> Reshape(Concat of
    the shape) -> MatMul; the context path's Reshape [0, 0, N*H] (copies dims from the middle value); a
    Transpose pair whose middle is also an output; a pair that does not cancel."""
    hidden = HEADS * HEAD_DIM
    w = np.random.default_rng(3).standard_normal((hidden, hidden)).astype(np.float32)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Reshape", ["r", "heads"], ["r4"]),
        helper.make_node("Transpose", ["r4"], ["t1"], perm=PERM),
        helper.make_node("Transpose", ["t1"], ["t2"], perm=PERM),
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Gather", ["x_shape", "one"], ["tokens"], axis=0),
        helper.make_node("Concat", ["first", "tokens", "minus_one"], ["flat"], axis=0),
        helper.make_node("Reshape", ["t2", "flat"], ["q"]),
        helper.make_node("MatMul", ["q", "w"], ["y"]),
        # the middle shape copies dims (0s): the last has none, so x reshapes straight to it
        helper.make_node("Reshape", ["y", "heads"], ["y4"]),
        helper.make_node("Reshape", ["y4", "zeros_flat"], ["y3"]),  # 0s: reads the middle's dims
        helper.make_node("Relu", ["y3"], ["z"]),
        helper.make_node("Reshape", ["x", "heads"], ["x4"]),
        helper.make_node("Transpose", ["x4"], ["shown"], perm=PERM),  # an output: stays
        helper.make_node("Transpose", ["shown"], ["back"], perm=PERM),
        helper.make_node("Transpose", ["back"], ["other"], perm=[0, 1, 3, 2]),  # does not undo the last
        helper.make_node("Transpose", ["other"], ["kept"], perm=PERM),
    ]
    inits = [numpy_helper.from_array(np.array([0, 0, HEADS, HEAD_DIM], np.int64), "heads"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([1], np.int64), "first"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
             numpy_helper.from_array(np.array([0, 0, hidden], np.int64), "zeros_flat"),
             numpy_helper.from_array(w, "w")]
    graph = helper.make_graph(nodes, "layout", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T", hidden])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("z", "shown", "kept")],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_layout_chains_fold_and_match_onnxruntime():
    model = _model()
    program = lower_graph(import_graph(model), has_kernel)
    names = ["z", "shown", "kept"]
    executor = Executor(program.steps, program.weights, program.opset, program.islands, names)
    ops = [step.key for step in executor._steps]
    # the q path's pair is gone and its two Reshapes are one; so are y's; the pair around `shown`
    # stays (an output), and so does the pair that does not cancel
    assert ops.count((DOMAIN, OP)) == 2 and ops.count(("", "Reshape")) == 1  # x4's
    assert ops.count(("", "Transpose")) == 4
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for tokens in (1, 5):
        x = np.random.default_rng(tokens).standard_normal((1, tokens, HEADS * HEAD_DIM)).astype(np.float32)
        got = executor.run({"x": x})
        for name, want in zip(names, session.run(names, {"x": x})):
            assert got[name].shape == want.shape
            np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6)


def test_a_middle_value_read_twice_is_not_folded():
    steps = [{"op": "Transpose", "domain": "", "inputs": ["x"], "outputs": ["a"], "attrs": {"perm": PERM}},
             {"op": "Transpose", "domain": "", "inputs": ["a"], "outputs": ["b"], "attrs": {"perm": PERM}},
             {"op": "Relu", "domain": "", "inputs": ["a"], "outputs": ["c"], "attrs": {}},
             {"op": "Reshape", "domain": "", "inputs": ["b", "s"], "outputs": ["d"], "attrs": {}},
             {"op": "Reshape", "domain": "", "inputs": ["d", "s2"], "outputs": ["e"], "attrs": {}},
             {"op": "Relu", "domain": "", "inputs": ["d"], "outputs": ["f"], "attrs": {}}]
    assert fold_views(steps, keep={"c", "e", "f"}) == steps
