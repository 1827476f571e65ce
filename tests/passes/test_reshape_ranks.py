"""Reshape shapes onnx's inference leaves unknown at opset <= 13 (computed target shapes), so the
values after them keep ranks and the fusions downstream still fire (fold/reshape_ranks.py)."""

import numpy as np
from infc.compiler.graph import import_graph
from infc.compiler.optimize import optimize_model
from infc.compiler.passes.fold.shape_inference import infer_shapes
from infc.compiler.testing import assert_matches_ort, make_model, ops_of
from onnx import helper

F32 = np.float32
RNG = np.random.default_rng(0)


def _dims(model, name):
    return infer_shapes(import_graph(model))[name][1]


def _group_norm_then_layer_norm(opset: int):
    """torch's GroupNorm below opset 18 (Reshape -> InstanceNormalization -> Reshape to Shape(x)),
    then a LayerNorm written out (ReduceMean ... Add) over the last axis."""
    nodes = [
        helper.make_node("Reshape", ["x", "groups"], ["grouped"]),
        helper.make_node("InstanceNormalization", ["grouped", "ones", "zeros"], ["normed"], epsilon=1e-5),
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Reshape", ["normed", "x_shape"], ["back"]),
        helper.make_node("ReduceMean", ["back"], ["mean"], axes=[-1]),
        helper.make_node("Sub", ["back", "mean"], ["centered"]),
        helper.make_node("Pow", ["centered", "two"], ["squared"]),
        helper.make_node("ReduceMean", ["squared"], ["variance"], axes=[-1]),
        helper.make_node("Add", ["variance", "eps"], ["shifted"]),
        helper.make_node("Sqrt", ["shifted"], ["std"]),
        helper.make_node("Div", ["centered", "std"], ["unit"]),
        helper.make_node("Mul", ["unit", "gamma"], ["scaled"]),
        helper.make_node("Add", ["scaled", "beta"], ["y"]),
    ]
    inits = {"groups": np.array([0, 2, -1], np.int64), "ones": np.ones(2, F32), "zeros": np.zeros(2, F32),
             "two": np.array(2.0, F32), "eps": np.array(1e-5, F32),
             "gamma": RNG.random(16).astype(F32) + 0.5, "beta": RNG.standard_normal(16).astype(F32)}
    return make_model(nodes, [("x", F32, ["batch", 8, 16])], [("y", F32, [None] * 3)], inits, opset=opset)


def test_reshape_to_a_shape_of_gets_its_dims_at_opset_13():
    model = _group_norm_then_layer_norm(opset=13)
    assert _dims(model, "back") == ["batch", 8, 16]
    assert _dims(model, "grouped") == ["batch", 2, 64]  # 0 copies the input dim, -1 solved


def test_layer_norm_after_a_group_norm_fuses_at_opset_13():
    model = _group_norm_then_layer_norm(opset=13)
    result = optimize_model(model)
    assert "LayerNormalization" in ops_of(result.model)
    assert_matches_ort(model, result.model)


def test_head_split_of_symbolic_dims_solves_the_minus_one():
    # x.view(batch, seq, -1, 8) with batch and seq read from Shape(x): -1 is 32 / 8 by cancelling names
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
             helper.make_node("Gather", ["s", "one"], ["t"], axis=0),
             helper.make_node("Unsqueeze", ["b", "axis0"], ["b1"]),
             helper.make_node("Unsqueeze", ["t", "axis0"], ["t1"]),
             helper.make_node("Concat", ["b1", "t1", "minus1", "eight"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["heads"]),
             helper.make_node("Transpose", ["heads"], ["y"], perm=[0, 2, 1, 3])]
    inits = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "axis0": np.array([0], np.int64),
             "minus1": np.array([-1], np.int64), "eight": np.array([8], np.int64)}
    model = make_model(nodes, [("x", F32, ["batch", "seq", 32])], [("y", F32, [None] * 4)], inits, opset=13)
    assert _dims(model, "heads") == ["batch", "seq", 4, 8]
    assert _dims(model, "y") == ["batch", 4, "seq", 8]


def test_window_arithmetic_on_shape_values():
    # Swin's window partition: view(B, H // 4, 4, W // 4, 4, C) with H, W read from the input
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "one_start", "three"], ["hw"]),
             helper.make_node("Div", ["hw", "four"], ["windows"]),
             helper.make_node("Gather", ["windows", "zero"], ["wh"], axis=0),
             helper.make_node("Gather", ["windows", "one"], ["ww"], axis=0),
             helper.make_node("Unsqueeze", ["wh", "axis0"], ["wh1"]),
             helper.make_node("Unsqueeze", ["ww", "axis0"], ["ww1"]),
             helper.make_node("Concat", ["minus1", "wh1", "four", "ww1", "four", "c"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    inits = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "three": np.array([3], np.int64),
             "four": np.array([4], np.int64), "axis0": np.array([0], np.int64), "minus1": np.array([-1], np.int64),
             "c": np.array([6], np.int64)}
    inits["one_start"] = np.array([1], np.int64)
    model = make_model(nodes, [("x", F32, [2, 16, 8, 6])], [("y", F32, [None] * 6)], inits, opset=13)
    assert _dims(model, "y")[1:] == [4, 4, 2, 4, 6]


def test_torchscript_expand_target_is_read_through_its_equal_and_where():
    """x.expand(b, n, n) as TorchScript writes it: Expand(x, Where(Equal(shape, -1), 1, shape)); onnx
    cannot read the Where, the walk can (a named size is never -1)."""
    n = helper.make_node
    nodes = [n("Shape", ["y"], ["yb"], start=0, end=1), n("Shape", ["x"], ["xn"], start=1, end=3),
             n("Concat", ["yb", "xn"], ["target"], axis=0), n("Equal", ["target", "minus1"], ["is_any"]),
             n("Where", ["is_any", "ones", "target"], ["shape"]), n("Expand", ["x", "shape"], ["z"]),
             n("Add", ["z", "y"], ["out"])]
    inits = {"minus1": np.array([-1, -1, -1], np.int64), "ones": np.array([1, 1, 1], np.int64)}
    model = make_model(nodes, [("x", F32, [1, "n", "n"]), ("y", F32, ["b", 1, 1])], [("out", F32, [None, None, None])], inits)
    assert _dims(model, "z") == ["b", "n", "n"]
