"""Keras' LayerNormalization as tf2onnx writes it (x scaled, never centered) fuses into
LayerNormalization; the means are GlobalAveragePool on rank-3 inputs or ReduceMean."""

import numpy as np
import pytest
from onnx import helper

from infc.compiler.passes.fuse.layernorm import RULES
from infc.compiler.testing import assert_matches_ort, make_model, ops_of, rule_stats, run_rules

F32 = np.float32
RNG = np.random.default_rng(0)


def _mean(inp, out, how):
    if how == "gap":
        return helper.make_node("GlobalAveragePool", [inp], [out])
    return helper.make_node("ReduceMean", [inp], [out], axes=[-1])


def _model(how="gap", shape=(2, 5, 16), gamma_shape=None):
    c = shape[-1]
    nodes = [_mean("x", "mean", how), helper.make_node("Neg", ["mean"], ["neg_mean"]),
             helper.make_node("Sub", ["x", "mean"], ["d"]), helper.make_node("Mul", ["d", "d"], ["sq"]),
             _mean("sq", "var", how), helper.make_node("Add", ["var", "eps"], ["ve"]),
             helper.make_node("Sqrt", ["ve"], ["std"]), helper.make_node("Reciprocal", ["std"], ["r"]),
             helper.make_node("Mul", ["r", "gamma"], ["s"]), helper.make_node("Mul", ["x", "s"], ["xs"]),
             helper.make_node("Mul", ["neg_mean", "s"], ["ms"]), helper.make_node("Add", ["ms", "beta"], ["shift"]),
             helper.make_node("Add", ["xs", "shift"], ["y"])]
    inits = {"eps": np.array(1e-6, F32), "gamma": RNG.standard_normal(gamma_shape or (c,)).astype(F32),
             "beta": RNG.standard_normal((c,)).astype(F32)}
    return make_model(nodes, [("x", F32, list(shape))], [("y", F32, list(shape))], inits, opset=17)


@pytest.mark.parametrize("how,shape", [("gap", (2, 5, 16)), ("reduce", (2, 5, 16)), ("reduce", (2, 3, 4, 16))])
def test_scaled_layernorm_fuses(how, shape):
    model = _model(how, shape)
    result = run_rules(model, RULES)
    assert rule_stats(result, "layernorm_scaled") == (1, {})
    assert ops_of(result.model) == ["LayerNormalization"]
    assert_matches_ort(model, result.model)


def test_gamma_along_another_dim_declines():
    result = run_rules(_model(gamma_shape=(5, 1)), RULES)
    assert rule_stats(result, "layernorm_scaled") == (0, {"gamma or beta is not per normalized element": 1})
    assert "LayerNormalization" not in ops_of(result.model)
