import numpy as np
import pytest

F32 = np.float32
MS = "com.microsoft"


def test_batch_norm(rng, single_node, ort_check):
    x = rng.standard_normal((2, 3, 4, 5)).astype(F32)
    inits = {"s": rng.random(3).astype(F32) + 0.5, "b": rng.standard_normal(3).astype(F32),
             "m": rng.standard_normal(3).astype(F32), "v": rng.random(3).astype(F32) + 0.1}
    ort_check(single_node("BatchNormalization", {"x": x}, [("y", F32)], {"epsilon": 1e-3}, inits, opset=15), {"x": x})


def test_instance_and_group_norm(rng, single_node, ort_check):
    x = rng.standard_normal((2, 4, 5, 6)).astype(F32) * 3 + 1
    inits = {"s": rng.random(4).astype(F32), "b": rng.standard_normal(4).astype(F32)}
    ort_check(single_node("InstanceNormalization", {"x": x}, [("y", F32)], {"epsilon": 1e-4}, inits), {"x": x})
    ort_check(single_node("GroupNormalization", {"x": x}, [("y", F32)], {"num_groups": 2}, inits, opset=21), {"x": x})


@pytest.mark.parametrize("axis", [-1, 1, -2])
def test_layer_norm_with_stats(axis, rng, single_node, ort_check):
    x = rng.standard_normal((2, 3, 8)).astype(F32) * 2 + 0.5
    norm_shape = x.shape[axis:]
    inits = {"s": rng.standard_normal(norm_shape).astype(F32), "b": rng.standard_normal(norm_shape).astype(F32)}
    outs = [("y", F32), ("mean", F32), ("inv_std", F32)]
    ort_check(single_node("LayerNormalization", {"x": x}, outs, {"axis": axis, "epsilon": 1e-5}, inits), {"x": x})


def test_layer_norm_without_bias(rng, single_node, ort_check):
    x = rng.standard_normal((4, 16)).astype(F32)
    ort_check(single_node("LayerNormalization", {"x": x}, [("y", F32)], initializers={"s": rng.random(16).astype(F32)}),
              {"x": x})


def test_simplified_layer_norm_and_rms_norm(rng, single_node, ort_check):
    x = rng.standard_normal((2, 5, 16)).astype(F32) + 1
    inits = {"s": rng.random(16).astype(F32)}
    model = single_node("SimplifiedLayerNormalization", {"x": x}, [("y", F32), ("inv", F32)], {"epsilon": 1e-6}, inits)
    ort_check(model, {"x": x})
    ort_check(single_node("RMSNormalization", {"x": x}, [("y", F32)], {"epsilon": 1e-6}, inits, opset=23), {"x": x})


@pytest.mark.parametrize("with_beta,with_bias", [(False, False), (True, False), (True, True), (False, True)])
def test_skip_layer_norm(with_beta, with_bias, rng, single_node, ort_check):
    x, skip = rng.standard_normal((2, 4, 16)).astype(F32), rng.standard_normal((2, 4, 16)).astype(F32)
    inits = {"g": rng.random(16).astype(F32)}
    names = ["x", "s", "g", "beta" if with_beta else "", "bias" if with_bias else ""]
    if with_beta:
        inits["beta"] = rng.standard_normal(16).astype(F32)
    if with_bias:
        inits["bias"] = rng.standard_normal(16).astype(F32)
    outs = [("y", F32), ("mean", F32), ("inv_std", F32), ("sum", F32)]
    model = single_node("SkipLayerNormalization", {"x": x, "s": skip}, outs, {"epsilon": 1e-5}, inits, domain=MS,
                        input_names=names)
    ort_check(model, {"x": x, "s": skip})


@pytest.mark.parametrize("with_bias", [False, True])
def test_skip_simplified_layer_norm(with_bias, rng, single_node, ort_check):
    x, skip = rng.standard_normal((2, 4, 16)).astype(F32), rng.standard_normal((2, 4, 16)).astype(F32)
    inits = {"g": rng.random(16).astype(F32)}
    if with_bias:
        inits["bias"] = rng.standard_normal(16).astype(F32)
    outs = [("y", F32), ("", F32), ("inv_std", F32), ("sum", F32)]
    model = single_node("SkipSimplifiedLayerNormalization", {"x": x, "s": skip}, [o for o in outs if o[0]], {"epsilon": 1e-6},
                        inits, domain=MS)
    model.graph.node[0].output[:] = ["y", "", "inv_std", "sum"]
    ort_check(model, {"x": x, "s": skip})


def test_lrn_lp_norm_mvn(rng, single_node, ort_check):
    x = rng.standard_normal((2, 5, 3, 4)).astype(F32)
    ort_check(single_node("LRN", {"x": x}, [("y", F32)], {"size": 3, "alpha": 2e-4, "beta": 0.6, "bias": 1.5}), {"x": x})
    ort_check(single_node("LpNormalization", {"x": x}, [("y", F32)], {"axis": 1, "p": 2}), {"x": x})
    ort_check(single_node("LpNormalization", {"x": x}, [("y", F32)], {"axis": -1, "p": 1}), {"x": x})
    ort_check(single_node("MeanVarianceNormalization", {"x": x}, [("y", F32)]), {"x": x})
