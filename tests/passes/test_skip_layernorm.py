import numpy as np
import pytest
from onnx import helper

from infc.compiler.passes.fuse import rmsnorm, skip_layernorm
from infc.compiler.testing import assert_matches_ort, make_model, rule_stats, run_rules

F32 = np.float32
RNG = np.random.default_rng(0)
H = 16


def _model(a_shape=("batch", 3, H), b_shape=("batch", 3, H), norm="ln", bias=False, sum_read=True, opset=17,
           beta=True, stats_read=False, dtype=F32):
    nodes = [helper.make_node("Add", ["a", "bias"], ["ab"])] if bias else []
    nodes.append(helper.make_node("Add", ["ab" if bias else "a", "b"], ["s"]))
    norm_inputs = ["s", "gamma"] + ["beta"] * beta
    if norm == "ln":
        nodes.append(helper.make_node("LayerNormalization", norm_inputs, ["y"] + ["mean"] * stats_read, epsilon=1e-5))
    else:
        nodes.append(helper.make_node("RMSNormalization", ["s", "gamma"], ["y"], epsilon=1e-5))
    full = list(b_shape if len(b_shape) > len(a_shape) or a_shape[0] == 1 else a_shape)
    outputs = [("y", dtype, full)] + [("mean", F32, full[:-1] + [1])] * stats_read
    if sum_read:  # the next residual Add reads the sum too
        nodes.append(helper.make_node("Add", ["s", "y"], ["next"]))
        outputs.append(("next", dtype, full))
    inits = {n: RNG.standard_normal(H).astype(dtype) for n in ("gamma", "beta", "bias")}
    return make_model(nodes, [("a", dtype, list(a_shape)), ("b", dtype, list(b_shape))], outputs, inits, opset=opset)


def _fused(model, kind="SkipLayerNormalization", rules=skip_layernorm.RULES):
    result = run_rules(model, rules)
    assert rule_stats(result, "skip_layernorm") == (1, {})
    node = next(n for n in result.model.graph.node if n.op_type == kind)
    assert node.domain == "com.microsoft"
    assert_matches_ort(model, result.model)
    return node


@pytest.mark.parametrize("sum_read", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_residual_add_and_layernorm(sum_read, dtype):
    node = _fused(_model(sum_read=sum_read, dtype=dtype))
    assert list(node.input) == ["a", "b", "gamma", "beta"]
    assert list(node.output) == (["y", "", "", "s"] if sum_read else ["y"])


def test_bias_add_folds_into_the_bias_input():
    node = _fused(_model(bias=True, beta=False))
    assert list(node.input) == ["a", "b", "gamma", "", "bias"]


@pytest.mark.parametrize("a_shape,b_shape,full", [((2, 3, H), (1, 3, H), "a"), ((2, 3, H), (3, H), "a"),
                                                  ((1, 3, H), (2, 3, H), "b"), ((3, H), (3, H), "a")])
def test_skip_broadcast_as_onnxruntime_allows(a_shape, b_shape, full):
    node = _fused(_model(a_shape, b_shape))
    assert node.input[0] == full  # the output takes the input's shape


def test_rms_normalization_at_opset_23():
    node = _fused(_model(norm="rms", opset=23), "SkipSimplifiedLayerNormalization")
    assert list(node.input) == ["a", "b", "gamma"]


def test_after_rmsnorm_rules_at_opset_17():
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["s", "s"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]), helper.make_node("Add", ["ms", "eps"], ["mse"]),
             helper.make_node("Sqrt", ["mse"], ["std"]), helper.make_node("Div", ["s", "std"], ["n"]),
             helper.make_node("Mul", ["n", "gamma"], ["y"])]
    model = make_model(nodes, [("a", F32, [2, 3, H]), ("b", F32, [2, 3, H])], [("y", F32, [2, 3, H])],
                       {"eps": np.array(1e-6, F32), "gamma": RNG.standard_normal(H).astype(F32)})
    _fused(model, "SkipSimplifiedLayerNormalization", rmsnorm.RULES + skip_layernorm.RULES)


@pytest.mark.parametrize("a_shape,b_shape", [(("batch", 3, H), ("other", 3, H)), ((1, 2, 3, H), (1, 2, 3, H))])
def test_unprovable_or_unsupported_shapes_are_rejected(a_shape, b_shape):
    result = run_rules(_model(a_shape, b_shape), skip_layernorm.RULES)
    assert rule_stats(result, "skip_layernorm") == (
        0, {"input and skip shapes are not provably what onnxruntime accepts": 1})


def test_used_norm_statistics_are_rejected():
    result = run_rules(_model(stats_read=True), skip_layernorm.RULES)
    assert rule_stats(result, "skip_layernorm") == (0, {"norm statistics outputs are used": 1})


def test_double_is_rejected():
    result = run_rules(_model(dtype=np.float64), skip_layernorm.RULES)
    assert rule_stats(result, "skip_layernorm") == (0, {"input and skip are not both float32 or float16": 1})
