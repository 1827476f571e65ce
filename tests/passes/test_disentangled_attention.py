"""DeBERTa's disentangled attention (passes/fuse/merged_heads.py, attention.py): bmm(q, kᵀ / √(3d))
over (B*N) views, plus relative-position scores gathered along the queries' rows (their row count
not provable), viewed back with view(-1, heads, S, T), masked_fill, softmax, probs viewed
(-1, S, T) for the bmm with V; TorchScript reads the 3-D scores' sizes for the view, dynamo computes
them (SEW-D's pooled length; its mask's batch, made apart from the queries', leaves the
probabilities' batch unnamed). It fuses into
one MultiHeadAttention whose bias carries the relative scores, exactly, whether the bias has B * N
rows or one."""

import numpy as np
import pytest
from onnx import helper

from infc.compiler.optimize import optimize_model
from infc.compiler.testing import assert_matches_ort, make_model, ops_of, rule_stats

F32 = np.float32
N, H = 4, 8


def _disentangled(sizes: str):
    n = helper.make_node
    consts = {"minus1": np.array([-1], np.int64), "heads": np.array([N], np.int64), "head": np.array([H], np.int64),
              "sqrt": np.array(np.sqrt(3 * H), F32), "fill": np.array(np.finfo(F32).min, F32),
              "slice_s": np.array([-2], np.int64), "slice_t": np.array([-1], np.int64), "end": np.array([2**62], np.int64),
              "axis0": np.array([0], np.int64), "one": np.array(1, np.int64)}
    nodes = []
    for t in "qkv":  # (B, N, L, H) -> (B*N, L, H) as transpose_for_scores' view(-1, L, H)
        nodes += [n("Shape", [t], [f"{t}_len"], start=2, end=3),
                  n("Concat", ["minus1", f"{t}_len", "head"], [f"{t}_flat"], axis=0),
                  n("Reshape", [t, f"{t}_flat"], [f"{t}3"])]
    nodes += [n("Transpose", ["k3"], ["kt3"], perm=[0, 2, 1]), n("Div", ["kt3", "sqrt"], ["kts"]),
              n("MatMul", ["q3", "kts"], ["s3"]), n("Add", ["s3", "rel"], ["a3"])]
    if sizes == "computed":  # dynamo's sym_size arithmetic (here seq + 1 - 1), named by the shape walk
        nodes += [n("Shape", ["q"], ["q_s"], start=2, end=3), n("Squeeze", ["q_s"], ["q_s0"]),
                  n("Add", ["q_s0", "one"], ["s_p"]), n("Sub", ["s_p", "one"], ["s_n"]),
                  n("Reshape", ["s_n", "minus1"], ["s_u"]),
                  n("Concat", ["minus1", "heads", "s_u", "s_u"], ["view4"], axis=0)]
    elif sizes == "torchscript":  # size(-2), size(-1) as Squeeze(Slice(Shape)) then Unsqueeze
        nodes += [n("Shape", ["a3"], ["a_shape"]),
                  n("Slice", ["a_shape", "slice_s", "slice_t", "axis0"], ["s_1"]),
                  n("Slice", ["a_shape", "slice_t", "end", "axis0"], ["t_1"]),
                  n("Squeeze", ["s_1"], ["s_0"]), n("Squeeze", ["t_1"], ["t_0"]),
                  n("Unsqueeze", ["s_0", "axis0"], ["s_u"]), n("Unsqueeze", ["t_0", "axis0"], ["t_u"]),
                  n("Concat", ["minus1", "heads", "s_u", "t_u"], ["view4"], axis=0)]
    else:
        nodes += [n("Shape", ["a3"], ["st"], start=1, end=3), n("Concat", ["minus1", "heads", "st"], ["view4"], axis=0)]
    nodes += [n("Reshape", ["a3", "view4"], ["s4"]), n("Not", ["keep"], ["masked"]),
              n("Where", ["masked", "fill", "s4"], ["w"]), n("Softmax", ["w"], ["p"], axis=-1),
              n("Shape", ["p"], ["p_st"], start=2, end=4),
              n("Concat", ["minus1", "s_u", "s_u"] if sizes == "computed" else ["minus1", "p_st"], ["p_flat"], axis=0),
              n("Reshape", ["p", "p_flat"], ["p3"]), n("MatMul", ["p3", "v3"], ["c3"]),
              n("Shape", ["c3"], ["c_sh"], start=1, end=3),
              n("Concat", ["minus1", "heads", "s_u", "head"] if sizes == "computed" else ["minus1", "heads", "c_sh"],
                ["c_view"], axis=0),
              n("Reshape", ["c3", "c_view"], ["c4"]), n("Transpose", ["c4"], ["ct"], perm=[0, 2, 1, 3]),
              n("Shape", ["ct"], ["ct_bs"], start=0, end=2), n("Concat", ["ct_bs", "minus1"], ["merged"], axis=0),
              n("Reshape", ["ct", "merged"], ["y"])]
    qkv = [(t, F32, ["batch", N, "seq", H]) for t in "qkv"]
    inputs = qkv + [("rel", F32, ["rows", "seq", "seq"]), ("keep", np.bool_, ["batch" if sizes != "computed" else "mask_batch", 1, 1, "seq"])]
    return make_model(nodes, inputs, [("y", F32, ["batch", "seq", N * H])], consts, opset=18)


def _feeds(batch: int, seq: int, rows: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    keep = np.ones((batch, 1, 1, seq), bool)
    keep[-1, ..., seq - 2:] = False  # a padded sequence
    return {**{t: rng.standard_normal((batch, N, seq, H)).astype(F32) for t in "qkv"},
            "rel": rng.standard_normal((rows, seq, seq)).astype(F32), "keep": keep}


@pytest.mark.parametrize("sizes", ["shape", "torchscript", "computed"])
def test_disentangled_attention_fuses_with_the_relative_scores_as_bias(sizes):
    model = _disentangled(sizes)
    result = optimize_model(model)
    assert rule_stats(result, "merged_heads_scores")[0] == 1 and rule_stats(result, "merged_heads_context")[0] == 1
    assert ops_of(result.model).count("MultiHeadAttention") == 1 and "Softmax" not in ops_of(result.model)
    for batch, seq, rows in [(2, 7, 2 * N), (1, 5, N), (3, 6, 1)]:  # B * N rows, and one row broadcast
        assert_matches_ort(model, result.model, feeds=_feeds(batch, seq, rows))


def _xsoftmax_attention():
    """DeBERTa's XSoftmax on 4-D scores: masked_fill(~mask, min), softmax, masked_fill(~mask, 0); the
    mask (B, 1, S, T) masks padded queries' rows entirely."""
    n = helper.make_node
    consts = {"scale": np.array(H ** -0.5, F32), "fill": np.array(np.finfo(F32).min, F32),
              "zero": np.array(0, F32), "merged": np.array([0, 0, N * H], np.int64)}
    nodes = [n("MatMul", ["q", "kt"], ["s0"]), n("Mul", ["s0", "scale"], ["s"]), n("Not", ["keep"], ["masked"]),
             n("Where", ["masked", "fill", "s"], ["w"]), n("Softmax", ["w"], ["p0"], axis=-1),
             n("Where", ["masked", "zero", "p0"], ["p"]), n("MatMul", ["p", "v"], ["c"]),
             n("Transpose", ["c"], ["ct"], perm=[0, 2, 1, 3]), n("Reshape", ["ct", "merged"], ["y"])]
    inputs = [("q", F32, [2, N, 5, H]), ("kt", F32, [2, N, H, 5]), ("v", F32, [2, N, 5, H]), ("keep", np.bool_, [2, 1, 5, 5])]
    return make_model(nodes, inputs, [("y", F32, [2, 5, N * H])], consts, opset=18)


def test_xsoftmax_fuses_with_fully_masked_rows_exact():
    model = _xsoftmax_attention()
    result = optimize_model(model)
    assert rule_stats(result, "xsoftmax_as_nan_guard")[0] == 1
    assert ops_of(result.model).count("MultiHeadAttention") == 1 and "Softmax" not in ops_of(result.model)
    rng = np.random.default_rng(0)
    tokens = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)  # the second sequence padded
    feeds = {"q": rng.standard_normal((2, N, 5, H)).astype(F32), "kt": rng.standard_normal((2, N, H, 5)).astype(F32),
             "v": rng.standard_normal((2, N, 5, H)).astype(F32), "keep": (tokens[:, None, :, None] & tokens[:, None, None, :])}
    assert_matches_ort(model, result.model, feeds=feeds)
