"""Fold phase: shape inference, constant folding (Shape chains), BatchNorm and affine folding."""

import numpy as np
import onnx
from onnx import TensorProto, helper

from infc.compiler.optimize import optimize_model
from infc.compiler.passes.cleanup.dead_code import RemoveDeadCode
from infc.compiler.passes.fold import batchnorm, conv_affine
from infc.compiler.passes.fold.constant_folding import FoldConstants
from infc.compiler.passes.fold.shape_inference import InferShapes
from infc.compiler.passes.pipeline import PIPELINE, Phase, Step
from infc.compiler.verify import ort_session
from infc.compiler.testing import assert_matches_ort, make_model, ops_of, rule_stats, run_rules

F32 = np.float32
RNG = np.random.default_rng(0)


def _run(model, *passes):
    return optimize_model(model, (Phase("test", tuple(Step(p, "test") for p in passes)),))


def _output_dims(model):
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in model.graph.output[0].type.tensor_type.shape.dim]


def test_wrong_declared_output_shape_is_replaced_by_the_inferred_one():
    nodes = [helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])]
    model = make_model(nodes, [("x", F32, [2, 5])], [("y", F32, [2, 5])])  # declared wrong: really [5, 2]
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 2
    result = _run(model, InferShapes())
    assert _output_dims(result.model) == [5, 2]


def test_declared_zero_dim_and_odd_dim_params_are_unknowns():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = make_model(nodes, [("x", F32, [0, "p2o.DynamicDimension.0 + ?", 4])], [("y", F32, [None, None, None])])
    result = _run(model, InferShapes())
    dims = _output_dims(result.model)
    assert dims[2] == 4 and dims[0] != 0
    x = RNG.standard_normal((3, 2, 4)).astype(F32)  # ORT itself refuses the original's declared 0
    (y,) = ort_session(result.model).run(None, {"x": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_shape_chain_on_static_shape_folds_to_constants():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "idx"], ["d"], axis=0),
        helper.make_node("Unsqueeze", ["d", "zero"], ["d1"]),
        helper.make_node("Concat", ["d1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = {"idx": np.array(0, np.int64), "zero": np.array([0], np.int64), "minus1": np.array([-1], np.int64)}
    model = make_model(nodes, [("x", F32, [2, 3, 4])], [("y", F32, [2, 12])], inits)
    result = _run(model, InferShapes(), FoldConstants(), RemoveDeadCode())
    assert ops_of(result.model) == ["Reshape"]
    assert rule_stats(result, "fold_static_shape")[0] == 1
    assert_matches_ort(model, result.model)


def test_partially_dynamic_shape_folds_only_static_dims():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "idx"], ["d"], axis=0),
        helper.make_node("Cast", ["d"], ["y"], to=TensorProto.FLOAT),
    ]
    model = make_model(nodes, [("x", F32, ["batch", 7])], [("y", F32, [])], {"idx": np.array(1, np.int64)})
    result = _run(model, InferShapes(), FoldConstants(), RemoveDeadCode())
    assert "Shape" not in ops_of(result.model)
    dynamic = make_model(nodes, [("x", F32, ["batch", 7])], [("y", F32, [])], {"idx": np.array(0, np.int64)})
    assert "Shape" in ops_of(_run(dynamic, InferShapes(), FoldConstants(), RemoveDeadCode()).model)


def test_folding_declines_to_blow_up_the_model():
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["big"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
             helper.make_node("Add", ["x", "big"], ["y"])]
    model = make_model(nodes, [("x", F32, [256, 256])], [("y", F32, [256, 256])], {"shape": np.array([256, 256], np.int64)})
    result = _run(model, InferShapes(), FoldConstants())
    assert "ConstantOfShape" in ops_of(result.model)
    assert any("grow the model" in r for r in rule_stats(result, "fold_constant_node")[1])


def _conv_bn_model(with_bias: bool, epilogue=None):
    w = RNG.standard_normal((4, 3, 3, 3)).astype(F32)
    inits = {"w": w, "scale": RNG.uniform(0.5, 2, 4).astype(F32), "bias": RNG.standard_normal(4).astype(F32),
             "mean": RNG.standard_normal(4).astype(F32), "var": RNG.uniform(0.5, 2, 4).astype(F32)}
    conv_inputs = ["x", "w"] + (["b"] if with_bias else [])
    if with_bias:
        inits["b"] = RNG.standard_normal(4).astype(F32)
    nodes = [helper.make_node("Conv", conv_inputs, ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y" if epilogue is None else "n"], epsilon=1e-3)]
    if epilogue:
        inits["k"] = RNG.uniform(0.5, 2, (1, 4, 1, 1)).astype(F32)
        nodes.append(helper.make_node(epilogue, ["n", "k"], ["y"]))
    return make_model(nodes, [("x", F32, [1, 3, 8, 8])], [("y", F32, [1, 4, 8, 8])], inits)


def test_batchnorm_folds_into_conv_with_and_without_bias():
    for with_bias in (False, True):
        model = _conv_bn_model(with_bias)
        result = run_rules(model, batchnorm.RULES)
        assert rule_stats(result, "fold_batchnorm_into_conv") == (1, {})
        assert ops_of(result.model) == ["Conv"]
        assert_matches_ort(model, result.model)


def test_per_channel_mul_and_add_fold_into_conv():
    for kind in ("Mul", "Add", "Sub", "Div"):
        model = _conv_bn_model(True, epilogue=kind)
        result = optimize_model(model, (Phase("test", (Step(InferShapes(), ""),) + tuple(
            s for s in PIPELINE[1].steps if "batchnorm" in s.pass_.name or "affine" in s.pass_.name) + (Step(RemoveDeadCode(), ""),)),))
        assert ops_of(result.model) == ["Conv"], kind
        assert_matches_ort(model, result.model)


def test_affine_that_is_not_per_channel_is_rejected():
    model = _conv_bn_model(True, epilogue="Mul")
    k = next(t for t in model.graph.initializer if t.name == "k")
    k.CopyFrom(onnx.numpy_helper.from_array(RNG.uniform(0.5, 2, (1, 4, 8, 1)).astype(F32), "k"))
    result = run_rules(model, batchnorm.RULES + conv_affine.RULES)
    assert rule_stats(result, "fold_mul_into_conv") == (0, {"constant is not one value per output channel": 1})


def test_batchnorm_after_2d_matmul_folds_into_weights():
    inits = {"w": RNG.standard_normal((5, 4)).astype(F32), "scale": RNG.uniform(0.5, 2, 4).astype(F32),
             "bias": RNG.standard_normal(4).astype(F32), "mean": RNG.standard_normal(4).astype(F32),
             "var": RNG.uniform(0.5, 2, 4).astype(F32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("BatchNormalization", ["m", "scale", "bias", "mean", "var"], ["y"])]
    model = make_model(nodes, [("x", F32, [3, 5])], [("y", F32, [3, 4])], inits)
    result = run_rules(model, batchnorm.RULES)
    assert rule_stats(result, "fold_batchnorm_into_matmul") == (1, {})
    assert ops_of(result.model) == ["MatMul", "Add"]
    assert_matches_ort(model, result.model)


def _conv_transpose_model(group: int, epilogues: tuple[str, ...]):
    """ConvTranspose (a decoder head's upsampling) followed by per-channel Add/Mul/Div and BatchNorm."""
    cin, cout = 4, 6
    inits = {"w": RNG.standard_normal((cin, cout // group, 2, 2)).astype(F32)}
    nodes, last = [helper.make_node("ConvTranspose", ["x", "w"], ["t0"], strides=[2, 2], group=group)], "t0"
    for i, kind in enumerate(epilogues):
        out = f"t{i + 1}" if i + 1 < len(epilogues) else "y"
        if kind == "BatchNormalization":
            for name, low in (("scale", 0.5), ("bias", -1), ("mean", -1), ("var", 0.5)):
                inits[name] = RNG.uniform(low, 2, cout).astype(F32)
            nodes.append(helper.make_node(kind, [last, "scale", "bias", "mean", "var"], [out], epsilon=1e-3))
        else:
            inits[f"k{i}"] = RNG.uniform(0.5, 2, (cout, 1, 1)).astype(F32)
            nodes.append(helper.make_node(kind, [last, f"k{i}"], [out]))
        last = out
    return make_model(nodes, [("x", F32, [1, cin, 5, 5])], [("y", F32, [1, cout, 10, 10])], inits)


def test_bias_add_batchnorm_and_scales_fold_into_conv_transpose():
    for group in (1, 2):
        model = _conv_transpose_model(group, ("Add", "BatchNormalization", "Mul", "Div"))
        result = _run(model, InferShapes(), *(s.pass_ for s in PIPELINE[1].steps
                                              if "batchnorm" in s.pass_.name or "affine" in s.pass_.name), RemoveDeadCode())
        assert ops_of(result.model) == ["ConvTranspose"], group
        assert_matches_ort(model, result.model)


def test_batchnorm_with_other_channel_count_than_conv_transpose_output_is_rejected():
    # ConvTranspose(group 2) weight [4, 3, 2, 2] has 6 output channels; a 3-channel BN must not fold
    model = _conv_transpose_model(2, ("BatchNormalization",))
    for tensor in model.graph.initializer:
        if tensor.name in ("scale", "bias", "mean", "var"):
            tensor.CopyFrom(onnx.numpy_helper.from_array(np.ones(3, F32), tensor.name))
    result = run_rules(model, batchnorm.RULES, infer_shapes=False)
    assert rule_stats(result, "fold_batchnorm_into_conv") == (
        0, {"BatchNormalization channels differ from the Conv output channels": 1})


def test_a_name_two_branches_type_differently_keeps_each_branchs_type():
    """Optimum's merged decoders: both branches of the If define '/model/Cast_1_output_0', int64 in
    one, bool in the other. Shape inference's results are applied by name, so such a name gets no
    inferred type (before: the int64 one written into the bool branch, which onnxruntime refused)."""
    def branch(name: str, to: int) -> onnx.GraphProto:
        nodes = [helper.make_node("Cast", ["x"], ["shared"], to=to), helper.make_node("Cast", ["shared"], ["out"], to=TensorProto.FLOAT),
                 helper.make_node("Add", ["out", "out"], ["doubled"])]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info("doubled", TensorProto.FLOAT, [3])])

    node = helper.make_node("If", ["cond"], ["y"], then_branch=branch("with_past", TensorProto.INT64),
                            else_branch=branch("no_past", TensorProto.BOOL))
    graph = helper.make_graph([node], "merged", [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                                                 helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    optimized = ort_session(optimize_model(model).model)  # loads: each branch's Cast typed as it is
    x = np.array([0.0, 2.7, -1.5], np.float32)
    for cond in (True, False):
        feeds = {"cond": np.array(cond), "x": x}
        np.testing.assert_array_equal(optimized.run(None, feeds)[0], ort_session(model).run(None, feeds)[0])
