"""Sibling GEMM merging at lowering (compiler/lower_fuse.py); the elementwise chains are in test_chain.py."""

import numpy as np
import pytest
from onnx import helper

from infc.compiler.graph import import_graph
from infc.compiler.lower import lower_graph
from infc.compiler.runtime.kernels import has_kernel

F32 = np.float32


def _qkv(rng, biases=(True, True, True), extra_reader=False):
    weights = {f"w{i}": rng.standard_normal((8, n)).astype(F32) for i, n in enumerate((8, 8, 4))}
    nodes, outputs = [], []
    for i, biased in enumerate(biases):
        nodes.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]))
        if biased:
            weights[f"b{i}"] = rng.standard_normal(weights[f"w{i}"].shape[1]).astype(F32)
            nodes.append(helper.make_node("Add", [f"b{i}", f"m{i}"] if i == 1 else [f"m{i}", f"b{i}"], [f"y{i}"]))
        nodes.append(helper.make_node("Relu", [f"y{i}" if biased else f"m{i}"], [f"r{i}"]))
        outputs.append((f"r{i}", F32))
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["m0"], ["n0"]))
        outputs.append(("n0", F32))
    return nodes, outputs, weights


def _lower(graph_of, nodes, outputs, weights, feeds):
    model = graph_of(nodes, feeds, outputs, weights)
    return model, lower_graph(import_graph(model), has_kernel)


def test_q_k_v_projections_with_biases_become_one_gemm_one_add_one_split(graph_of, ort_check, rng):
    feeds = {"x": rng.standard_normal((2, 5, 8)).astype(F32)}
    model, program = _lower(graph_of, *_qkv(rng), feeds)
    ops = [s["op"] for s in program.steps]
    assert ops == ["MatMul", "Add", "Split", "Relu", "Relu", "Relu"]
    matmul, add, split = program.steps[:3]
    assert program.weights[matmul["inputs"][1]].shape == (8, 20) and program.weights[add["inputs"][1]].shape == (20,)
    assert program.weights[split["inputs"][1]].tolist() == [8, 8, 4] and split["outputs"] == ["y0", "y1", "y2"]
    assert not {"w0", "w1", "w2", "b0", "b1", "b2"} & set(program.weights)  # the originals are not stored twice
    ort_check(model, feeds)


def test_missing_bias_merges_the_gemms_only(graph_of, ort_check, rng):
    feeds = {"x": rng.standard_normal((3, 8)).astype(F32)}
    model, program = _lower(graph_of, *_qkv(rng, biases=(True, False, True)), feeds)
    assert [s["op"] for s in program.steps][:2] == ["MatMul", "Split"]
    assert program.steps[1]["outputs"] == ["m0", "m1", "m2"]
    assert sum(s["op"] == "Add" for s in program.steps) == 2
    ort_check(model, feeds)


def test_a_gemm_output_read_twice_keeps_its_own_bias_add(graph_of, ort_check, rng):
    feeds = {"x": rng.standard_normal((3, 8)).astype(F32)}
    model, program = _lower(graph_of, *_qkv(rng, extra_reader=True), feeds)
    assert program.steps[1]["op"] == "Split" and program.steps[1]["outputs"] == ["m0", "m1", "m2"]
    ort_check(model, feeds)


def _swiglu(rng, activation="QuickGelu", gate=0, up_read_twice=False, split_sizes=True):
    """x @ [Wg | Wu] -> Split in halves -> activation of half `gate` -> times the other half."""
    weights = {"w": rng.standard_normal((8, 12)).astype(F32)}
    split_inputs = ["h"]
    if split_sizes:
        weights["sizes"] = np.array([6, 6], np.int64)
        split_inputs.append("sizes")
    halves = ["g", "u"] if gate == 0 else ["u", "g"]
    attrs = {"alpha": 1.0} if activation == "QuickGelu" else {}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Split", split_inputs, halves, axis=-1),
             helper.make_node(activation, ["g"], ["a"], domain="com.microsoft", **attrs),
             helper.make_node("Mul", ["u", "a"] if gate else ["a", "u"], ["y"])]
    outputs = [("y", F32)]
    if up_read_twice:
        nodes.append(helper.make_node("Neg", ["u"], ["n"]))
        outputs.append(("n", F32))
    return nodes, outputs, weights


@pytest.mark.parametrize("activation, gate", [("QuickGelu", 0), ("QuickGelu", 1), ("FastGelu", 0), ("Gelu", 1)])
def test_split_activation_mul_becomes_one_gated_step_with_the_same_bits(graph_of, ort_check, rng, activation, gate,
                                                                        monkeypatch):
    from infc.compiler import lower_fuse
    from infc.compiler.runtime.executor import Executor

    feeds = {"x": rng.standard_normal((2, 33, 8)).astype(F32) * 3}
    model, program = _lower(graph_of, *_swiglu(rng, activation, gate), feeds)
    assert [s["op"] for s in program.steps] == ["MatMul", "GatedActivation"]
    assert program.steps[1]["attrs"]["gate"] == gate and program.steps[1]["attrs"]["activation"] == activation
    ort_check(model, feeds)
    fused = Executor(program.steps, program.weights, program.opset, program.islands, ["y"]).run(feeds)["y"]
    monkeypatch.setattr(lower_fuse, "fuse_gated", lambda steps, weights, graph, visible=None: steps)
    plain = lower_graph(import_graph(model), has_kernel)
    assert "GatedActivation" not in [s["op"] for s in plain.steps]
    unfused = Executor(plain.steps, plain.weights, plain.opset, plain.islands, ["y"]).run(feeds)["y"]
    assert np.array_equal(fused, unfused)  # the activation's own kernel, then one product


def test_gated_steps_keep_their_numpy_path(graph_of, rng):
    from infc.compiler.runtime import jit
    from infc.compiler.runtime.executor import Executor

    feeds = {"x": rng.standard_normal((3, 8)).astype(F32)}
    model, program = _lower(graph_of, *_swiglu(rng, split_sizes=False), feeds)
    assert [s["op"] for s in program.steps] == ["MatMul", "GatedActivation"]
    run = Executor(program.steps, program.weights, program.opset, program.islands, ["y"])
    compiled = run.run(feeds)["y"]
    with jit.disabled():
        plain = run.run(feeds)["y"]
    np.testing.assert_allclose(plain, compiled, rtol=1e-4, atol=1e-6)  # the two QuickGelu paths differ as much


def test_a_half_read_elsewhere_is_not_fused(graph_of, ort_check, rng):
    feeds = {"x": rng.standard_normal((3, 8)).astype(F32)}
    model, program = _lower(graph_of, *_swiglu(rng, up_read_twice=True), feeds)
    assert "GatedActivation" not in [s["op"] for s in program.steps]
    ort_check(model, feeds)
