"""Cleanup passes: no-op removal, dead code, CSE, Constant nodes (also inside If bodies)."""

import numpy as np
import onnx
from onnx import TensorProto, helper

from infc.compiler.optimize import optimize_model
from infc.compiler.passes.cleanup.constant_nodes import ConstantNodesToTensors
from infc.compiler.passes.cleanup.cse import CommonSubexpressions
from infc.compiler.passes.cleanup.dead_code import RemoveDeadCode
from infc.compiler.passes.cleanup.noop import RemoveNoOps
from infc.compiler.passes.fold.shape_inference import InferShapes
from infc.compiler.passes.pipeline import Phase, Step
from infc.compiler.testing import assert_matches_ort, make_model, ops_of, rule_stats

F32 = np.float32


def _run(model, *passes):
    return optimize_model(model, (Phase("test", tuple(Step(p, "test") for p in passes)),))


def test_identity_dropout_and_same_type_cast_are_removed():
    nodes = [
        helper.make_node("Identity", ["x"], ["a"]),
        helper.make_node("Dropout", ["a"], ["b"]),
        helper.make_node("Cast", ["b"], ["c"], to=TensorProto.FLOAT),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    model = make_model(nodes, [("x", F32, [2, 3])], [("y", F32, [2, 3])])
    result = _run(model, InferShapes(), RemoveNoOps(), RemoveDeadCode())
    assert ops_of(result.model) == ["Relu"]
    for rule in ("remove_identity", "remove_dropout", "remove_same_type_cast"):
        assert rule_stats(result, rule)[0] == 1
    assert_matches_ort(model, result.model)


def test_cast_to_other_type_stays():
    nodes = [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.DOUBLE)]
    model = make_model(nodes, [("x", F32, [2])], [("y", np.float64, [2])])
    assert ops_of(_run(model, InferShapes(), RemoveNoOps()).model) == ["Cast"]


def test_casts_of_bfloat16_values_are_judged_by_type_not_crashed_on():
    """graphsurgeon keeps a bfloat16 constant's type as its TensorProto code, which crashed the rule
    (TypeError: Cannot interpret '16'); now it decides, and the bf16 -> fp32 Cast stays."""
    import ml_dtypes

    nodes = [helper.make_node("Cast", ["w"], ["b"], to=TensorProto.BFLOAT16),
             helper.make_node("Cast", ["b"], ["c"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "c"], ["y"])]
    model = make_model(nodes, [("x", F32, [2, 3])], [("y", F32, [2, 3])],
                       {"w": np.arange(6, dtype=F32).reshape(2, 3).astype(ml_dtypes.bfloat16)})
    result = _run(model, InferShapes(), RemoveNoOps(), RemoveDeadCode())
    assert ops_of(result.model)[-2:] == ["Cast", "Add"]
    assert_matches_ort(model, result.model)


def test_noop_reshape_and_identity_transpose_are_removed_but_a_real_transpose_stays():
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["a"]),
        helper.make_node("Transpose", ["a"], ["b"], perm=[0, 1]),
        helper.make_node("Transpose", ["b"], ["y"], perm=[1, 0]),
    ]
    model = make_model(nodes, [("x", F32, [3, 3])], [("y", F32, [3, 3])], {"shape": np.array([3, 3], np.int64)})
    result = _run(model, InferShapes(), RemoveNoOps(), RemoveDeadCode())
    assert ops_of(result.model) == ["Transpose"]  # square, but the perm moves elements
    assert_matches_ort(model, result.model)


def test_dropout_with_used_mask_is_kept_with_reason():
    nodes = [helper.make_node("Dropout", ["x"], ["y", "mask"])]
    model = make_model(nodes, [("x", F32, [2])], [("y", F32, [2]), ("mask", np.bool_, [2])])
    result = _run(model, RemoveNoOps())
    assert rule_stats(result, "remove_dropout") == (0, {"its mask output is used": 1})


def test_removal_before_a_graph_output_keeps_the_output_name():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["y"])]
    model = make_model(nodes, [("x", F32, [2])], [("y", F32, [2])])
    result = _run(model, RemoveNoOps(), RemoveDeadCode())
    assert ops_of(result.model) == ["Relu"]
    assert [o.name for o in result.model.graph.output] == ["y"]
    assert_matches_ort(model, result.model)


def test_identity_from_input_to_output_is_kept():
    model = make_model([helper.make_node("Identity", ["x"], ["y"])], [("x", F32, [2])], [("y", F32, [2])])
    result = _run(model, RemoveNoOps())
    assert ops_of(result.model) == ["Identity"]
    assert rule_stats(result, "remove_identity")[1]


def test_dead_nodes_and_unused_initializers_go():
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Add", ["x", "w"], ["unused"])]
    model = make_model(nodes, [("x", F32, [2])], [("y", F32, [2])], {"w": np.ones(2, F32)})
    result = _run(model, RemoveDeadCode())
    assert ops_of(result.model) == ["Relu"]
    assert not result.model.graph.initializer


def test_cse_merges_equal_nodes_and_constants():
    nodes = [
        helper.make_node("Add", ["x", "c1"], ["a"]),
        helper.make_node("Add", ["x", "c2"], ["b"]),  # c2 == c1
        helper.make_node("Mul", ["a", "b"], ["y"]),
    ]
    model = make_model(nodes, [("x", F32, [3])], [("y", F32, [3])], {"c1": np.arange(3, dtype=F32), "c2": np.arange(3, dtype=F32)})
    result = _run(model, CommonSubexpressions(), RemoveDeadCode())
    assert sorted(ops_of(result.model)) == ["Add", "Mul"]
    assert_matches_ort(model, result.model)


def test_cse_keeps_random_ops_apart():
    nodes = [
        helper.make_node("RandomUniformLike", ["x"], ["a"], seed=1.0),
        helper.make_node("RandomUniformLike", ["x"], ["b"], seed=1.0),
        helper.make_node("Add", ["a", "b"], ["y"]),
    ]
    model = make_model(nodes, [("x", F32, [3])], [("y", F32, [3])])
    assert len(_run(model, CommonSubexpressions()).model.graph.node) == 3


def _if_model_with_constant_weights():
    then_w = helper.make_node("Constant", [], ["tw"], value=onnx.numpy_helper.from_array(np.full(3, 2.0, F32)))
    then_graph = helper.make_graph([then_w, helper.make_node("Mul", ["x", "tw"], ["t_out"])], "then", [],
                                   [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, [3])])
    else_graph = helper.make_graph([helper.make_node("Neg", ["x"], ["e_out"])], "else", [],
                                   [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, [3])])
    nodes = [
        helper.make_node("Constant", [], ["w"], value_floats=[1.0, 2.0, 3.0]),
        helper.make_node("Add", ["x", "w"], ["s"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph),
        helper.make_node("Add", ["s", "y"], ["z"]),
    ]
    return make_model(nodes, [("x", F32, [3]), ("cond", np.bool_, [])], [("z", F32, [3])])


def test_constant_nodes_become_tensors_in_main_graph_and_if_bodies():
    model = _if_model_with_constant_weights()
    result = _run(model, ConstantNodesToTensors(), RemoveDeadCode())
    assert rule_stats(result, "constant_node_to_tensor")[0] == 2
    assert result.ops_after.get("Constant", 0) == 0
    for cond in (True, False):
        feeds = {"x": np.arange(3, dtype=F32), "cond": np.array(cond)}
        assert_matches_ort(model, result.model, feeds=feeds)
