"""Layout passes: Transpose pairs cancel, Transposes become matmul trans flags, constant weights
are stored in read order."""

import numpy as np
import onnx
import pytest
from onnx import helper

from infc.compiler.optimize import optimize_model
from infc.compiler.passes.cleanup.dead_code import RemoveDeadCode
from infc.compiler.passes.cleanup.noop import RemoveNoOps
from infc.compiler.passes.engine import RewritePass
from infc.compiler.passes.fold.constant_folding import FoldConstants
from infc.compiler.passes.fold.shape_inference import InferShapes
from infc.compiler.passes.layout import pretranspose_weights, transpose_cancel, transpose_into_matmul
from infc.compiler.passes.pipeline import Phase, Step
from infc.compiler.testing import assert_matches_ort, make_model, ops_of, rule_stats, run_rules

F32 = np.float32
RNG = np.random.default_rng(0)
FLOAT = onnx.TensorProto.FLOAT


def _run(model, *passes):
    steps = (Step(InferShapes(), "shapes"),) + tuple(Step(p, "under test") for p in passes) + (Step(RemoveDeadCode(), "tidy"),)
    return optimize_model(model, (Phase("test", steps),))


def _attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _transposes(p, q, x_shape=(2, 3, 4), extra_use=False):
    t_shape = list(np.empty(x_shape).transpose(p).shape)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Transpose", ["r"], ["t"], **({"perm": p} if p else {})),
             helper.make_node("Transpose", ["t"], ["y"], **({"perm": q} if q else {}))]
    outputs = [("y", F32, list(np.empty(t_shape).transpose(q).shape))]
    if extra_use:
        nodes.append(helper.make_node("Neg", ["t"], ["z"]))
        outputs.append(("z", F32, t_shape))
    return make_model(nodes, [("x", F32, list(x_shape))], outputs)


# --- transpose_cancel ---------------------------------------------------------------------------

def test_inverse_pair_cancels_and_the_noop_pass_removes_the_identity():
    model = _transposes([0, 2, 1], [0, 2, 1])
    result = _run(model, RewritePass("cancel", transpose_cancel.RULES), RemoveNoOps())
    assert rule_stats(result, "cancel_transpose_pair") == (1, {})
    assert ops_of(result.model) == ["Relu"]
    assert result.model.graph.output[0].name == "y"
    assert_matches_ort(model, result.model)


@pytest.mark.parametrize("p,q", [([1, 0, 2], [0, 2, 1]), ([2, 0, 1], [2, 0, 1]), (None, [1, 0, 2])])
def test_chain_merges_into_one_transpose(p, q):
    model = _transposes(p, q)
    result = run_rules(model, transpose_cancel.RULES)
    assert rule_stats(result, "cancel_transpose_pair") == (1, {})
    assert ops_of(result.model) == ["Relu", "Transpose"]
    assert_matches_ort(model, result.model)


def test_first_transpose_with_other_consumers_stays_for_them():
    model = _transposes([0, 2, 1], [0, 2, 1], extra_use=True)
    result = _run(model, RewritePass("cancel", transpose_cancel.RULES), RemoveNoOps())
    assert rule_stats(result, "cancel_transpose_pair") == (1, {})
    assert sorted(ops_of(result.model)) == ["Neg", "Relu", "Transpose"]
    assert_matches_ort(model, result.model)


def test_default_perm_with_unknown_rank_is_declined():
    model = _transposes(None, [1, 0], x_shape=(2, 3))
    for value in list(model.graph.input) + list(model.graph.output):
        value.type.tensor_type.ClearField("shape")
    result = run_rules(model, transpose_cancel.RULES, infer_shapes=False)
    assert rule_stats(result, "cancel_transpose_pair") == (0, {"perm omitted and rank unknown": 1})


# --- transpose_into_matmul ----------------------------------------------------------------------

def _matmul(a_shape, b_shape, perm_a=None, perm_b=None, dtype=F32):
    operands = [np.empty(s).transpose(p) if p else np.empty(s) for s, p in ((a_shape, perm_a), (b_shape, perm_b))]
    nodes, names = [], []
    for side, perm in (("a", perm_a), ("b", perm_b)):
        if perm is not None:
            nodes.append(helper.make_node("Transpose", [side], [side + "t"], perm=perm))
        names.append(side + "t" if perm is not None else side)
    nodes.append(helper.make_node("MatMul", names, ["y"]))
    return make_model(nodes, [("a", dtype, a_shape), ("b", dtype, b_shape)], [("y", dtype, list(np.matmul(*operands).shape))])


@pytest.mark.parametrize("a_shape,b_shape,perm_a,perm_b,flags", [
    ([2, 5, 3], [5, 4], [0, 2, 1], None, {"transA": 1}),
    ([2, 3, 5, 4], [2, 3, 6, 4], None, [0, 1, 3, 2], {"transB": 1}),
    ([2, 5, 3], [2, 4, 5], [0, 2, 1], [0, 2, 1], {"transA": 1, "transB": 1}),
])
def test_last_two_dim_transpose_becomes_fused_matmul_flag(a_shape, b_shape, perm_a, perm_b, flags):
    model = _matmul(a_shape, b_shape, perm_a, perm_b)
    result = run_rules(model, transpose_into_matmul.RULES)
    (node,) = result.model.graph.node
    assert (node.op_type, node.domain) == ("FusedMatMul", "com.microsoft")
    assert {k: v for k, v in _attrs(node).items() if k.startswith("trans")} == flags
    assert_matches_ort(model, result.model)


def test_2d_operands_become_gemm():
    model = _matmul([6, 4], [5, 4], None, [1, 0])
    result = run_rules(model, transpose_into_matmul.RULES)
    assert rule_stats(result, "transpose_into_matmul_transB") == (1, {})
    (node,) = result.model.graph.node
    assert node.op_type == "Gemm" and _attrs(node) == {"transB": 1}
    assert_matches_ort(model, result.model)


def test_transpose_into_existing_gemm_flips_its_flag():
    nodes = [helper.make_node("Transpose", ["a"], ["at"]), helper.make_node("Gemm", ["at", "w", "c"], ["y"], transA=1)]
    inits = {"w": RNG.standard_normal((6, 5)).astype(F32), "c": RNG.standard_normal(5).astype(F32)}
    model = make_model(nodes, [("a", F32, [4, 6])], [("y", F32, [4, 5])], inits)
    result = run_rules(model, transpose_into_matmul.RULES)
    assert rule_stats(result, "transpose_into_gemm_transA") == (1, {})
    assert ops_of(result.model) == ["Gemm"] and _attrs(result.model.graph.node[0]).get("transA") == 0
    assert_matches_ort(model, result.model)


def test_other_permutations_are_declined():
    result = run_rules(_matmul([3, 2, 5], [5, 4], [1, 0, 2]), transpose_into_matmul.RULES)
    assert rule_stats(result, "transpose_into_matmul_transA") == (0, {"Transpose does not swap only the last two dims": 1})


def test_float64_fused_matmul_is_declined():
    result = run_rules(_matmul([2, 5, 3], [5, 4], [0, 2, 1], dtype=np.float64), transpose_into_matmul.RULES)
    assert rule_stats(result, "transpose_into_matmul_transA") == (0, {"FusedMatMul runs only float32 on CPU": 1})


def test_integer_matmul_is_declined():
    result = run_rules(_matmul([6, 4], [5, 4], None, [1, 0], dtype=np.int64), transpose_into_matmul.RULES)
    assert rule_stats(result, "transpose_into_matmul_transB") == (
        0, {"MatMul is not floating point (Gemm and FusedMatMul are)": 1})


# --- pretranspose_weights -----------------------------------------------------------------------

def test_gemm_trans_b_constant_is_stored_transposed():
    nodes = [helper.make_node("Gemm", ["a", "w", "c"], ["y"], transB=1, alpha=0.5)]
    inits = {"w": RNG.standard_normal((5, 6)).astype(F32), "c": RNG.standard_normal(5).astype(F32)}
    model = make_model(nodes, [("a", F32, [4, 6])], [("y", F32, [4, 5])], inits)
    result = run_rules(model, pretranspose_weights.RULES)
    # The rewritten Gemm is visited again on the next round and declined as not applicable,
    # which is not counted as a rejection.
    assert rule_stats(result, "pretranspose_gemm_transB") == (1, {})
    node = result.model.graph.node[0]
    assert _attrs(node) == {"alpha": 0.5}
    weight = next(t for t in result.model.graph.initializer if t.name == node.input[1])
    assert list(weight.dims) == [6, 5]
    assert_matches_ort(model, result.model)


def test_layout_phase_turns_a_transposed_weight_back_into_plain_matmul():
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]), helper.make_node("MatMul", ["a", "wt"], ["y"])]
    model = make_model(nodes, [("a", F32, [2, 4, 6])], [("y", F32, [2, 4, 5])], {"w": RNG.standard_normal((5, 6)).astype(F32)})
    result = _run(model, RewritePass("t", transpose_into_matmul.RULES), RewritePass("p", pretranspose_weights.RULES))
    assert rule_stats(result, "transpose_into_matmul_transB") == (1, {})
    assert rule_stats(result, "pretranspose_fused_matmul_transB")[0] == 1
    assert ops_of(result.model) == ["MatMul"]
    assert_matches_ort(model, result.model)


def test_constant_folding_already_folds_a_transposed_constant_weight():
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]), helper.make_node("MatMul", ["a", "wt"], ["y"])]
    model = make_model(nodes, [("a", F32, [2, 4, 6])], [("y", F32, [2, 4, 5])], {"w": RNG.standard_normal((5, 6)).astype(F32)})
    result = _run(model, FoldConstants())
    assert ops_of(result.model) == ["MatMul"]
    assert_matches_ort(model, result.model)


def test_shared_weight_is_declined():
    nodes = [helper.make_node("Gemm", ["a", "w"], ["y"], transB=1), helper.make_node("Gemm", ["a", "w"], ["z"])]
    model = make_model(nodes, [("a", F32, [6, 6])], [("y", F32, [6, 6]), ("z", F32, [6, 6])],
                       {"w": RNG.standard_normal((6, 6)).astype(F32)})
    result = run_rules(model, pretranspose_weights.RULES)
    matched, rejected = rule_stats(result, "pretranspose_gemm_transB")
    assert matched == 0 and rejected["weight is shared with other nodes"] == 1
    assert ops_of(result.model) == ["Gemm", "Gemm"]
