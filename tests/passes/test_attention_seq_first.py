"""torch's multi_head_attention_forward with need_weights=True (passes/fuse/attention_seq_first.py):
(S, B, E) projections split as (S, B*N, H) views, 3-D bmm, a 3-D bias (WavLM's gated relative
position bias: B*N rows, or one broadcast), 3-D Softmax, context transposed back and merged. One
MultiHeadAttention, exact against onnxruntime; a split that does not end in a static head size
is left alone with its reason."""

import numpy as np
import pytest
from onnx import helper

from infc.compiler.optimize import optimize_model
from infc.compiler.testing import assert_matches_ort, make_model, ops_of, rule_stats

F32 = np.float32
N, H = 4, 8
E = N * H


def _need_weights_attention(head: int = H):
    n = helper.make_node
    consts = {"scale": np.array(head ** -0.5, F32), "minus1": np.array([-1], np.int64),
              "head": np.array([head], np.int64), "merged": np.array([-1, E], np.int64)}
    nodes = []
    for t in "qkv":  # view(len, bsz * num_heads, head_dim) with len read from the input
        nodes += [n("Shape", [t], [f"{t}_len"], start=0, end=1),
                  n("Concat", [f"{t}_len", "minus1", "head"], [f"{t}_split"], axis=0),
                  n("Reshape", [t, f"{t}_split"], [f"{t}3"])]
    nodes += [n("Transpose", ["q3"], ["qh"], perm=[1, 0, 2]), n("Mul", ["qh", "scale"], ["qs"]),
              n("Transpose", ["k3"], ["kh"], perm=[1, 2, 0]), n("Transpose", ["v3"], ["vh"], perm=[1, 0, 2]),
              n("MatMul", ["qs", "kh"], ["s"]), n("Add", ["s", "bias"], ["sb"]), n("Softmax", ["sb"], ["p"], axis=-1),
              n("MatMul", ["p", "vh"], ["c"]), n("Transpose", ["c"], ["cs"], perm=[1, 0, 2]),
              n("Reshape", ["cs", "merged"], ["y"])]
    inputs = [("q", F32, ["seq", "batch", E]), ("k", F32, ["src", "batch", E]), ("v", F32, ["src", "batch", E]),
              ("bias", F32, ["rows", "seq", "src"])]
    return make_model(nodes, inputs, [("y", F32, [None, E])], consts, opset=18)


def _feeds(seq: int, src: int, batch: int, rows: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"q": rng.standard_normal((seq, batch, E)).astype(F32),
            **{t: rng.standard_normal((src, batch, E)).astype(F32) for t in "kv"},
            "bias": rng.standard_normal((rows, seq, src)).astype(F32)}


def test_need_weights_attention_fuses_exactly():
    model = _need_weights_attention()
    result = optimize_model(model)
    assert rule_stats(result, "attention_seq_first")[0] == 1
    assert rule_stats(result, "attention_mha") == (0, {})  # its 3-D scores are no 4-D rule's miss
    assert ops_of(result.model).count("MultiHeadAttention") == 1 and "Softmax" not in ops_of(result.model)
    for seq, src, batch, rows in [(5, 5, 2, 2 * N), (3, 6, 3, 1), (1, 4, 1, N)]:
        assert_matches_ort(model, result.model, feeds=_feeds(seq, src, batch, rows))


def test_a_head_size_that_does_not_divide_the_width_is_left_alone():
    result = optimize_model(_need_weights_attention(head=5))
    assert rule_stats(result, "attention_seq_first") == (
        0, {"a head split does not provably keep (S, B, E) -> (S, B*N, H) with one static H": 1})
