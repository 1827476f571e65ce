"""Why an attention matched no rule at all (passes/fuse/attention_miss.py): each Softmax of Q·Kᵀ
scores left unfused is reported with the first place its structure leaves the rules' form; a
classifier's Softmax (over a product with a weight) is not attention and is not reported."""

import numpy as np
from onnx import helper

from infc.compiler.optimize import optimize_model
from infc.compiler.testing import make_model, rule_stats

F32 = np.float32
B, N, S, H = 2, 4, 5, 8


def _explained(model):
    result = optimize_model(model)
    return rule_stats(result, "attention_mha")


def _attention(scores_nodes, scores_out, after_probs, output_shape, inputs_extra=(), inits=None):
    nodes = scores_nodes + [helper.make_node("Softmax", [scores_out], ["p"], axis=-1)] + after_probs
    inputs = [("q", F32, [B, N, S, H]), ("kt", F32, [B, N, H, S]), ("v", F32, [B, N, S, H]), *inputs_extra]
    return make_model(nodes, inputs, [("y", F32, output_shape)], inits or {})


def test_merged_heads_scores_are_named():
    nodes = [helper.make_node("MatMul", ["q3", "kt3"], ["s"])]
    after = [helper.make_node("MatMul", ["p", "v3"], ["y"])]
    model = make_model(nodes + [helper.make_node("Softmax", ["s"], ["p"], axis=-1)] + after,
                       [("q3", F32, [B * N, S, H]), ("kt3", F32, [B * N, H, S]), ("v3", F32, [B * N, S, H])],
                       [("y", F32, [B * N, S, H])])
    assert _explained(model) == (0, {"the scores are 3-D [8, 5, 5], not (B, N, S, T): heads merged into the batch,"
                                     " or not split": 1})


def test_scores_through_a_reshape_are_named():
    """tf2onnx's Einsum lowering: the product is reshaped and squeezed before the scale."""
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s4"]),
             helper.make_node("Reshape", ["s4", "shape"], ["s5"]),
             helper.make_node("Squeeze", ["s5", "axes"], ["s"]),
             helper.make_node("Mul", ["s", "scale"], ["scaled"])]
    after = [helper.make_node("MatMul", ["p", "v"], ["ctx"]),
             helper.make_node("Transpose", ["ctx"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["t", "merge"], ["y"])]
    inits = {"shape": np.array([B, N, S, S, 1], np.int64), "axes": np.array([4], np.int64),
             "scale": np.array(0.3, F32), "merge": np.array([B, S, N * H], np.int64)}
    model = _attention(nodes, "scaled", after, [B, S, N * H], inits=inits)
    assert _explained(model) == (0, {"Reshape, Squeeze between the scores' MatMul and the Softmax (the rules take "
                                     "only scale, soft-cap and mask ops there)": 1})


def test_a_context_not_transposed_back_is_named():
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"])]
    after = [helper.make_node("MatMul", ["p", "v"], ["ctx"]), helper.make_node("Relu", ["ctx"], ["y"])]
    model = _attention(nodes, "s", after, [B, N, S, H])
    assert _explained(model) == (0, {"the context P·V is read by Relu, not transposed to (B, S, N, H) and merged": 1})


def test_a_fused_attention_and_a_classifier_softmax_say_nothing():
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"])]
    after = [helper.make_node("MatMul", ["p", "v"], ["ctx"]),
             helper.make_node("Transpose", ["ctx"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["t", "merge"], ["y"])]
    model = _attention(nodes, "s", after, [B, S, N * H], inits={"merge": np.array([B, S, N * H], np.int64)})
    assert _explained(model) == (1, {})
    classifier = make_model([helper.make_node("MatMul", ["x", "w"], ["logits"]),
                             helper.make_node("Softmax", ["logits"], ["y"], axis=-1)],
                            [("x", F32, [B, 16])], [("y", F32, [B, 10])], {"w": np.ones((16, 10), F32)})
    assert _explained(classifier) == (0, {})


def test_a_masked_fill_over_a_reshape_is_named_through_the_where():
    """Where(mask, fill, Sub(scores, x)): the path follows the scores, not the Where's bool condition
    (DeBERTa's masked_fill before this sweep's merged-heads forms: nothing was said)."""
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s4"]), helper.make_node("Sub", ["s4", "shift"], ["s"]),
             helper.make_node("Not", ["keep"], ["masked"]), helper.make_node("Where", ["masked", "fill", "s"], ["w"])]
    after = [helper.make_node("MatMul", ["p", "v"], ["y"])]
    model = _attention(nodes, "w", after, [B, N, S, H], [("keep", np.bool_, [B, 1, S, S]), ("shift", F32, [B, N, S, S])],
                       {"fill": np.array(-1e38, F32)})
    assert _explained(model) == (0, {"Sub between the scores' MatMul and the Softmax (the rules take only"
                                     " scale, soft-cap and mask ops there)": 1})
