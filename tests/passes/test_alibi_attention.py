"""Attention with an ALiBi position bias (passes/fuse/merged_heads.py, score_bias.py): Bloom's (B*N)-row
baddbmm / bmm made 4-D, MPT's masked_fill and bias joined into one mask; exact against onnxruntime on
the tests/models/hf fixtures, and the rewrites refuse what they cannot prove."""

import numpy as np
import onnx
import pytest
from onnx import helper

from infc.compiler.optimize import optimize_model
from infc.compiler.passes.fuse import merged_heads, score_bias
from infc.compiler.testing import FIXTURES, assert_matches_ort, make_model, ops_of, rule_stats, run_rules

F32 = np.float32
HF = FIXTURES / "hf"


def _feeds(model, batch: int, seq: int, past: int, left_pad: int, seed: int = 0) -> dict:
    """Input ids, a left-padded attention mask (rows >= 1) and random past K/V."""
    rng, inputs = np.random.default_rng(seed), {i.name: i for i in model.graph.input}
    kv = inputs["past_key_values.0.key"].type.tensor_type.shape.dim
    mask = np.ones((batch, past + seq), np.int64)
    mask[1:, :left_pad] = 0
    feeds = {"input_ids": rng.integers(0, 128, (batch, seq)), "attention_mask": mask}
    feeds |= {n: rng.standard_normal((batch, kv[1].dim_value, past, kv[3].dim_value)).astype(F32)
              for n in inputs if n.startswith("past")}
    return feeds


@pytest.mark.parametrize("name", ["bloom_ts", "mpt_ts"])
def test_alibi_fixtures_optimize_exactly(name):
    model = onnx.load(HF / f"{name}.onnx")
    result = optimize_model(model)
    optimized = result.model
    if name == "bloom_ts":  # every layer's Q·Kᵀ and P·V made 4-D, the bias joined to the mask
        assert rule_stats(result, "merged_heads_scores")[0] == 2 and rule_stats(result, "merged_heads_context")[0] == 2
        assert rule_stats(result, "bias_into_mask")[0] == 2
    else:  # masked_fill turned around, ALiBi after it: MultiHeadAttention with one bias
        assert ops_of(optimized).count("MultiHeadAttention") == 2 and "Softmax" not in ops_of(optimized)
    for batch, seq, past, left_pad in [(2, 5, 0, 2), (2, 3, 5, 3), (2, 1, 7, 2)]:
        assert_matches_ort(model, optimized, feeds=_feeds(model, batch, seq, past, left_pad), rtol=1e-4)


B, N, S, T, H = 2, 4, 3, 5, 8


def _bmm_attention(q_rows: list, bias_rows: int | None = None):
    """Bloom's form on static shapes: q (B, N, S, H) and k, v (B, N, T, H) flattened to q_rows leading
    rows, scores viewed back as (B, N, S, T) for the Softmax."""
    inits = {"q_flat": np.array([q_rows[0], -1, H]), "k_flat": np.array([q_rows[0], -1, H]),
             "view": np.array([B, N, S, -1]), "p_flat": np.array([B * N, S, -1]), "ctx_view": np.array([B, N, S, H]),
             "scale": np.array(0.3, F32)}
    nodes = [helper.make_node("Reshape", ["q", "q_flat"], ["q3"]), helper.make_node("Reshape", ["k", "k_flat"], ["k3"]),
             helper.make_node("Transpose", ["k3"], ["kt3"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q3", "kt3"], ["s3"]), helper.make_node("Mul", ["s3", "scale"], ["scaled"])]
    inputs = [("q", F32, [B, N, S, H]), ("k", F32, [B, N, T, H]), ("v", F32, [B, N, T, H])]
    last = "scaled"
    if bias_rows is not None:
        inputs.append(("bias", F32, [bias_rows, 1, T]))
        nodes.append(helper.make_node("Add", [last, "bias"], ["biased"]))
        last = "biased"
    nodes += [helper.make_node("Reshape", [last, "view"], ["s4"]), helper.make_node("Softmax", ["s4"], ["p4"], axis=-1),
              helper.make_node("Reshape", ["p4", "p_flat"], ["p3"]), helper.make_node("Reshape", ["v", "k_flat"], ["v3"]),
              helper.make_node("MatMul", ["p3", "v3"], ["ctx3"]), helper.make_node("Reshape", ["ctx3", "ctx_view"], ["y"])]
    return make_model(nodes, inputs, [("y", F32, [B, N, S, H])], inits)


@pytest.mark.parametrize("bias_rows", [None, 1, B * N])
def test_batch_heads_products_become_4d(bias_rows):
    model = _bmm_attention([B * N], bias_rows)
    result = run_rules(model, merged_heads.SCORES + merged_heads.CONTEXT)
    assert rule_stats(result, "merged_heads_scores")[0] == 1 and rule_stats(result, "merged_heads_context")[0] == 1
    matmuls = [n for n in result.model.graph.node if n.op_type == "MatMul"]
    assert [n.input[0] for n in matmuls] == ["q", "p4"]
    assert_matches_ort(model, result.model)


def test_flattening_that_does_not_merge_batch_and_heads_is_left_alone():
    model = _bmm_attention([B])  # (B, N*S, H): every head's rows in one block, not per-head attention
    result = run_rules(model, merged_heads.SCORES + merged_heads.CONTEXT)
    assert rule_stats(result, "merged_heads_scores") == (
        0, {"a flattening Reshape does not provably merge the first two axes": 1})
    assert rule_stats(result, "merged_heads_context")[0] == 0
    assert sorted(ops_of(result.model)) == sorted(ops_of(model))


def _masked_fill(fill: float, biased: bool = True):
    """MPT's order: scores + bias, then Where(mask, fill, scores)."""
    inits = {"fill": np.array(fill, F32)}
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"])]
    last = "s"
    if biased:
        nodes.append(helper.make_node("Add", ["s", "bias"], ["biased"]))
        last = "biased"
    nodes += [helper.make_node("Where", ["masked", "fill", last], ["filled"]),
              helper.make_node("Softmax", ["filled"], ["p"], axis=-1)]
    inputs = [("q", F32, [B, N, S, H]), ("kt", F32, [B, N, H, T]), ("bias", F32, [1, N, 1, T]),
              ("masked", np.bool_, [1, 1, S, T])]
    return make_model(nodes, inputs[:2] + inputs[2 if biased else 3:], [("p", F32, [B, N, S, T])], inits)


def test_masked_fill_and_bias_join_the_mask_exactly():
    model = _masked_fill(float(np.finfo(F32).min))
    result = run_rules(model, score_bias.RULES)
    assert rule_stats(result, "masked_fill_as_where")[0] == 1 and rule_stats(result, "bias_after_mask")[0] == 1
    feeds = {"q": np.random.default_rng(0).standard_normal((B, N, S, H)).astype(F32),
             "kt": np.random.default_rng(1).standard_normal((B, N, H, T)).astype(F32),
             "bias": np.random.default_rng(2).standard_normal((1, N, 1, T)).astype(F32),
             "masked": np.triu(np.ones((S, T), bool), T - S + 1)[None, None]}
    assert_matches_ort(model, result.model, feeds=feeds)


def test_a_fill_that_does_not_absorb_the_bias_is_left_alone():
    result = run_rules(_masked_fill(-100.0), score_bias.RULES)
    assert rule_stats(result, "masked_fill_as_where") == (
        0, {"the Where's first branch is not one fill value at or below -1e30": 1})
