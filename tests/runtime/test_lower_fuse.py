"""Sibling GEMM merging at lowering (compiler/lower_fuse.py); the elementwise chains are in test_chain.py."""

import numpy as np
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
