"""The executor's onnxruntime calls (runtime/ort_call.py) and the one-session fast path: same outputs
as onnxruntime through its own `run`, fewer Python layers on the way."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from infc.compiler.errors import BadInput
from infc.compiler.runtime.executor import Executor
from infc.compiler.runtime.ort_call import named_feeds, session_runner

F32 = np.float32


def _two_input_model() -> bytes:
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [None]) for name in ("a", "b")]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [None]) for name in ("s", "p")]
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["a", "b"], ["p"])]
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


def test_bound_run_gives_what_run_gives():
    session = ort.InferenceSession(_two_input_model(), providers=["CPUExecutionProvider"])
    run = session_runner(session)
    assert run != session.run  # the bound C++ run, not the Python wrapper
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal(5).astype(F32), "b": rng.standard_normal(5).astype(F32)}
    for got, expected in zip(run(["p", "s"], feeds), session.run(["p", "s"], feeds)):
        np.testing.assert_array_equal(got, expected)


def test_named_feeds_turn_numpy_scalars_into_arrays():
    feeds = named_feeds(["a", "b"], [np.float32(2.0), np.ones(2, F32)])
    assert type(feeds["a"]) is np.ndarray and feeds["a"].shape == () and feeds["b"].shape == (2,)


def _grouped_program():
    """Two tactic steps of one group: the executor runs them as one session and nothing else."""
    marks = {"tactic": "onnxruntime", "tactic_group": 0}
    return [{"op": "Add", "domain": "", "name": "add", "inputs": ["a", "b"], "outputs": ["s"], "attrs": {}, **marks},
            {"op": "Mul", "domain": "", "name": "mul", "inputs": ["s", "b"], "outputs": ["p"], "attrs": {}, **marks}]


def test_a_program_that_is_one_group_session_takes_the_one_session_path():
    # outputs asked in another order than the group writes them, and a feed the program does not read
    executor = Executor(_grouped_program(), {}, opset=17, output_names=["p", "s"])
    assert [step.key[1] for step in executor._steps] == ["__onnxruntime_group__"]
    assert executor._sole_island is executor._steps[0]
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(6).astype(F32), rng.standard_normal(6).astype(F32)
    out = executor.run({"a": a, "b": b, "unused": np.zeros(1, F32)})
    assert list(out) == ["p", "s"]
    reference = ort.InferenceSession(_reference_model(), providers=["CPUExecutionProvider"])
    expected_p, expected_s = reference.run(["p", "s"], {"a": a, "b": b})
    np.testing.assert_array_equal(out["s"], expected_s)
    np.testing.assert_array_equal(out["p"], expected_p)


def _reference_model() -> bytes:
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [None]) for name in ("a", "b")]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [None]) for name in ("p", "s")]
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["s", "b"], ["p"])]
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


def test_a_missing_feed_of_the_one_session_path_is_bad_input_naming_it():
    executor = Executor(_grouped_program(), {}, opset=17, output_names=["p", "s"])
    with pytest.raises(BadInput, match="missing input.*: b$"):
        executor.run({"a": np.ones(2, F32)})
