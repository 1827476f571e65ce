"""MatMul + bias into Gemm, Gemm + activation into com.microsoft.FusedGemm."""

import numpy as np
import pytest
from onnx import helper

from infc.compiler.passes.fuse import gemm
from infc.compiler.testing import assert_matches_ort, make_model, ops_of, rule_stats, run_rules

F32 = np.float32
RNG = np.random.default_rng(0)


def _linear(a_shape=(4, 6), bias_shape=(5,), act=None, act_attrs=None, dtype=F32, commuted=False):
    out_shape = list(a_shape[:-1]) + [5]
    nodes = [helper.make_node("MatMul", ["a", "w"], ["mm"]),
             helper.make_node("Add", ["bias", "mm"] if commuted else ["mm", "bias"], ["s" if act else "y"])]
    if act:
        nodes.append(helper.make_node(act, ["s"], ["y"], **(act_attrs or {})))
    inits = {"w": RNG.standard_normal((a_shape[-1], 5)).astype(dtype), "bias": RNG.standard_normal(bias_shape).astype(dtype)}
    return make_model(nodes, [("a", dtype, list(a_shape))], [("y", dtype, out_shape)], inits)


def _attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("bias_shape", [(5,), (1, 5), ()])
def test_matmul_bias_becomes_gemm(bias_shape):
    model = _linear(bias_shape=bias_shape)
    result = run_rules(model, gemm.RULES)
    assert rule_stats(result, "fuse_matmul_bias_gemm") == (1, {})
    assert ops_of(result.model) == ["Gemm"]
    assert_matches_ort(model, result.model)


def test_commuted_bias_add_matches():
    result = run_rules(_linear(commuted=True), gemm.RULES)
    assert rule_stats(result, "fuse_matmul_bias_gemm")[0] == 1


@pytest.mark.parametrize("act,attrs,expected", [
    ("Relu", {}, {}),
    ("Sigmoid", {}, {}),
    ("Tanh", {}, {}),
    ("LeakyRelu", {}, {"activation_alpha": 0.01}),
    ("HardSigmoid", {"alpha": 0.3}, {"activation_alpha": 0.3, "activation_beta": 0.5}),
    ("Elu", {"alpha": 0.5}, {"activation_alpha": 0.5}),
])
def test_matmul_bias_activation_becomes_fused_gemm(act, attrs, expected):
    model = _linear(act=act, act_attrs=attrs)
    result = run_rules(model, gemm.RULES)
    assert rule_stats(result, "fuse_matmul_bias_gemm")[0] == 1
    assert rule_stats(result, "fuse_gemm_activation") == (1, {})
    (node,) = result.model.graph.node
    assert (node.op_type, node.domain) == ("FusedGemm", "com.microsoft")
    got = _attrs(node)
    assert got["activation"] == act.encode()
    assert {k: v for k, v in got.items() if k.startswith("activation_")} == pytest.approx(expected)
    assert_matches_ort(model, result.model)


def test_gemm_attributes_survive_into_fused_gemm():
    nodes = [helper.make_node("Gemm", ["a", "w"], ["g"], transB=1, alpha=0.5), helper.make_node("Relu", ["g"], ["y"])]
    model = make_model(nodes, [("a", F32, [4, 6])], [("y", F32, [4, 5])], {"w": RNG.standard_normal((5, 6)).astype(F32)})
    result = run_rules(model, gemm.RULES)
    assert rule_stats(result, "fuse_gemm_activation") == (1, {})
    assert _attrs(result.model.graph.node[0])["transB"] == 1
    assert_matches_ort(model, result.model)


def test_rank_3_input_is_declined_not_reshaped():
    result = run_rules(_linear(a_shape=(2, 4, 6)), gemm.RULES)
    assert rule_stats(result, "fuse_matmul_bias_gemm") == (0, {"A is rank 3; Gemm needs 2-D": 1})
    assert ops_of(result.model) == ["MatMul", "Add"]


def test_bias_along_rows_is_declined():
    result = run_rules(_linear(bias_shape=(4, 1)), gemm.RULES)
    assert rule_stats(result, "fuse_matmul_bias_gemm") == (0, {"bias does not broadcast along the last dim": 1})


def test_clip_after_gemm_is_declined():
    model = _linear(act="Clip")
    result = run_rules(model, gemm.RULES)
    assert rule_stats(result, "fuse_gemm_activation") == (0, {"FusedGemm has no Clip activation": 1})
    assert ops_of(result.model) == ["Gemm", "Clip"]


def test_float64_activation_is_declined():
    result = run_rules(_linear(act="Relu", dtype=np.float64), gemm.RULES)
    assert rule_stats(result, "fuse_gemm_activation") == (0, {"FusedGemm runs only float32 on CPU": 1})
    assert ops_of(result.model) == ["Gemm", "Relu"]
