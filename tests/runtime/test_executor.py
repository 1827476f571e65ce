import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper

from infc.compiler.errors import BadInput, InfcError
from infc.compiler.runtime.executor import Executor
from infc.compiler.runtime.kernels import KERNELS, has_kernel
from infc.compiler.testing import FIXTURES

F32 = np.float32


def _chain_steps():
    return [
        {"op": "Relu", "domain": "", "inputs": ["x"], "outputs": ["a"], "attrs": {}},
        {"op": "Add", "domain": "", "inputs": ["a", "w"], "outputs": ["b"], "attrs": {}},
        {"op": "Neg", "domain": "", "inputs": ["b"], "outputs": ["y"], "attrs": {}},
        {"op": "Mul", "domain": "", "inputs": ["a", "b"], "outputs": ["z"], "attrs": {}},
    ]


def test_runs_steps_and_frees_after_last_use():
    executor = Executor(_chain_steps(), {"w": np.ones(3, F32)}, opset=17, output_names=["y", "z"])
    x = np.array([-1, 0, 2], F32)
    out = executor.run({"x": x})
    np.testing.assert_array_equal(out["y"], -(np.maximum(x, 0) + 1))
    np.testing.assert_array_equal(out["z"], np.maximum(x, 0) * (np.maximum(x, 0) + 1))
    frees = [sorted(step.frees) for step in executor._steps]
    assert frees == [["x"], [], [], ["a", "b"]]  # weights and outputs are never freed


def test_default_outputs_are_unconsumed_values():
    executor = Executor(_chain_steps(), {"w": np.ones(3, F32)}, opset=17)
    assert executor.output_names == ["y", "z"]
    assert executor.input_names == ["x"]


def test_missing_feed_and_unknown_kernel_are_bad_input():
    executor = Executor(_chain_steps(), {"w": np.ones(3, F32)}, opset=17)
    with pytest.raises(BadInput, match="missing input"):
        executor.run({})
    with pytest.raises(BadInput, match="no runtime kernel"):
        Executor([{"op": "NoSuchOp", "domain": "", "inputs": ["x"], "outputs": ["y"], "attrs": {}}], {}, opset=17)


def test_tensor_attributes_are_decoded():
    steps = [{"op": "Constant", "domain": "", "inputs": [], "outputs": ["c"],
              "attrs": {"value": {"tensor": {"dtype": "int64", "shape": [2], "data": [3, 4]}}}}]
    out = Executor(steps, {}, opset=17).run({})
    assert out["c"].dtype == np.int64 and out["c"].tolist() == [3, 4]


def test_island_step_runs_in_onnxruntime(native):
    from infc.compiler.graph import import_graph
    from infc.compiler.lower import lower_graph

    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Inverse", ["r"], ["inv"], domain="com.microsoft"),
             helper.make_node("Neg", ["inv"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2, 2])],
                              [helper.make_tensor_value_info("y", 1, [2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    model = onnx.shape_inference.infer_shapes(model)  # island inputs need their types, as after the passes
    program = lower_graph(import_graph(model), has_kernel)
    assert [s["op"] for s in program.steps] == ["Relu", "__island__", "Neg"]
    executor = Executor(program.steps, program.weights, program.opset, program.islands, ["y"])
    x = np.array([[2, 1], [1, 3]], F32)
    np.testing.assert_allclose(executor.run({"x": x})["y"], -np.linalg.inv(x), rtol=1e-5)


def test_registry_keys_and_domain_aliases():
    assert all(isinstance(d, str) and isinstance(o, str) and callable(k) for (d, o), k in KERNELS.items())
    assert has_kernel("", "Conv") and has_kernel("ai.onnx", "Conv")
    assert has_kernel("com.microsoft", "FusedConv") and not has_kernel("com.microsoft", "Conv")


def test_runtime_imports_no_compiler_half():
    code = ("import sys, json, infc.compiler.runtime.executor; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('infc', 'onnx', 'onnxruntime', "
            "'onnx_graphsurgeon'))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    forbidden = [m for m in loaded if m.startswith(("infc.compiler.passes", "infc.compiler.autotune", "infc.compiler.lower",
                                                    "onnx"))]
    assert forbidden == []


@pytest.mark.parametrize("name", ["cnn_ts", "cnn_dynamo", "bert_ts", "bert_dynamo", "gpt2_ts", "gpt2_dynamo",
                                  "llama_ts", "llama_dynamo"])
def test_fixture_models_match_ort(name, ort_check):
    from infc.compiler.feeds import random_feeds

    model = onnx.load(FIXTURES / f"{name}.onnx")
    ort_check(model, random_feeds(model, 0, None))


def test_shape_arithmetic_is_memoized_per_input_shape():
    calls = []
    steps = [
        {"op": "Shape", "domain": "", "inputs": ["x"], "outputs": ["s"], "attrs": {}},
        {"op": "Mul", "domain": "", "inputs": ["s", "two"], "outputs": ["s2"], "attrs": {}},
        {"op": "ConstantOfShape", "domain": "", "inputs": ["s2"], "outputs": ["y"], "attrs": {}},
        {"op": "Add", "domain": "", "inputs": ["x", "x"], "outputs": ["z"], "attrs": {}},
    ]
    executor = Executor(steps, {"two": np.array([2], np.int64)}, opset=17, output_names=["y", "z"])
    mul = executor._steps[1]
    original = mul.run
    mul.run = lambda *args: calls.append(1) or original(*args)
    for shape in [(3,), (3,), (4,), (3,)]:
        out = executor.run({"x": np.ones(shape, F32)})
        assert out["y"].shape == (2 * shape[0],) and out["z"].shape == shape
    assert len(calls) == 2  # once per distinct input shape
    # a feed overriding a weight turns the memo off for that call
    out = executor.run({"x": np.ones(3, F32), "two": np.array([3], np.int64)})
    assert out["y"].shape == (9,)


def test_observer_sees_every_produced_value():
    seen = {}
    executor = Executor(_chain_steps(), {"w": np.ones(3, F32)}, opset=17,
                        observer=lambda name, array: seen.__setitem__(name, array.shape))
    executor.run({"x": np.zeros(3, F32)})
    assert seen == {"a": (3,), "b": (3,), "y": (3,), "z": (3,)}


def test_static_values_crossing_shape_segments_stay_available():
    # s1 (segment 1) feeds a static step of segment 2 (after the second Shape): on memo hits only the
    # values read outside their own segment are put in place, and a new shape in segment 2 still finds s1.
    steps = [
        {"op": "Shape", "domain": "", "inputs": ["x"], "outputs": ["s1"], "attrs": {}},
        {"op": "Mul", "domain": "", "inputs": ["s1", "two"], "outputs": ["inner"], "attrs": {}},
        {"op": "Add", "domain": "", "inputs": ["inner", "two"], "outputs": ["s1b"], "attrs": {}},
        {"op": "Shape", "domain": "", "inputs": ["y"], "outputs": ["s2"], "attrs": {}},
        {"op": "Add", "domain": "", "inputs": ["s1b", "s2"], "outputs": ["total"], "attrs": {}},
        {"op": "ConstantOfShape", "domain": "", "inputs": ["total"], "outputs": ["z"], "attrs": {}},
    ]
    executor = Executor(steps, {"two": np.array([2], np.int64)}, opset=17, output_names=["z"])
    assert [s.needed for s in executor._steps] == [True, False, True, True, True, True]
    for x_len, y_len in [(3, 1), (3, 1), (3, 5), (4, 5), (3, 1)]:
        out = executor.run({"x": np.ones(x_len, F32), "y": np.ones(y_len, F32)})
        assert out["z"].shape == (2 * x_len + 2 + y_len,)


def test_a_failed_run_forgets_the_memo():
    steps = [{"op": "Shape", "domain": "", "inputs": ["x"], "outputs": ["s"], "attrs": {}},
             {"op": "Mul", "domain": "", "inputs": ["s", "two"], "outputs": ["s2"], "attrs": {}},
             {"op": "Reshape", "domain": "", "inputs": ["x", "s2"], "outputs": ["y"], "attrs": {}}]
    executor = Executor(steps, {"two": np.array([2], np.int64)}, opset=17, output_names=["y"])
    with pytest.raises(Exception):
        executor.run({"x": np.ones(3, F32)})  # 3 values cannot take shape (6,)
    assert executor._states == {} and all(not s.memo for s in executor._steps)


def test_the_memo_holds_with_more_shape_steps_than_shapes_cached(monkeypatch):
    # every Shape step a run passes is a state of its own: a model with more Shape steps than the
    # cap on cached shape sets must still hit the memo from its second run on
    monkeypatch.setattr("infc.compiler.runtime.executor.MAX_CACHED_SHAPES", 4)
    steps, outputs = [], []
    for i in range(10):
        steps += [{"op": "Shape", "domain": "", "inputs": ["x"], "outputs": [f"s{i}"], "attrs": {}},
                  {"op": "Mul", "domain": "", "inputs": [f"s{i}", "two"], "outputs": [f"m{i}"], "attrs": {}},
                  {"op": "ConstantOfShape", "domain": "", "inputs": [f"m{i}"], "outputs": [f"c{i}"], "attrs": {}},
                  {"op": "Concat", "domain": "", "inputs": ["x", f"c{i}"], "outputs": [f"y{i}"], "attrs": {"axis": 0}}]
        outputs.append(f"y{i}")
    executor = Executor(steps, {"two": np.array([2], np.int64)}, opset=17, output_names=outputs)
    calls = []
    for step in executor._steps[1::4]:
        step.run = (lambda original: lambda *args: calls.append(1) or original(*args))(step.run)
    for shape in [(3,), (3,), (5,), (3,), (5,)]:
        out = executor.run({"x": np.ones(shape, F32)})
        assert all(out[name].shape == (3 * shape[0],) for name in outputs)
    assert len(calls) == 20  # each Mul once per distinct input shape


def test_a_failing_step_is_named_and_the_next_run_is_clean():
    # the hot loop names the running step only when one fails (executor._run_fast)
    steps = [{"op": "Relu", "domain": "", "name": "relu", "inputs": ["x"], "outputs": ["a"], "attrs": {}},
             {"op": "Reshape", "domain": "", "name": "bad", "inputs": ["a", "shape"], "outputs": ["y"], "attrs": {}}]
    executor = Executor(steps, {"shape": np.array([2, -1], np.int64)}, opset=17, output_names=["y"])
    with pytest.raises(InfcError, match="Reshape 'bad'"):
        executor.run({"x": np.ones(3, F32)})
    assert executor._current is None
    x = np.array([-1, 2, -3, 4], F32)
    np.testing.assert_array_equal(executor.run({"x": x})["y"], np.maximum(x, 0).reshape(2, 2))
