"""Dynamo exports read every size off the graph inputs' Shape: learned position embeddings sliced to
the sequence length (bounded_broadcast.py), `view(-1, seq)` (reshape_ranks.py) and K transposed in
3-D (attention_layout.py) left attention and residual norms unfused; now they fuse and stay exact."""

import numpy as np
import onnx_graphsurgeon as gs
from onnx import helper

from infc.compiler.optimize import optimize_model
from infc.compiler.passes.fold.shape_inference import infer_shapes
from infc.compiler.testing import assert_matches_ort, make_model

VOCAB, TABLE, D, HEAD = 50, 16, 32, 8


def _c(name, values, dtype=np.int64):
    return name, np.asarray(values, dtype)


def _model(pos_start: int = 0):
    """Token and position embeddings (positions as table[:, start:seq]), one attention written as torch's
    dynamo export writes SDPA (sizes off Shape(input_ids), K transposed through 3-D views, √scale on
    both sides, the NaN guard), an output projection."""
    rng = np.random.default_rng(0)
    w = {name: _c(name, rng.standard_normal(shape) * 0.3, np.float32)
         for name, shape in [("tok", [VOCAB, D]), ("pos", [TABLE, D]), ("wq", [D, D]), ("wk", [D, D]),
                             ("wv", [D, D]), ("wo", [D, D])]}
    consts = [_c("pos_ids", np.arange(TABLE).reshape(1, TABLE)), _c("start", [pos_start]), _c("ax1", [1]),
              _c("minus1", [-1]), _c("head", [HEAD]), _c("i0", [0]), _c("i2", [2]), _c("i3", [3]), _c("i4", [4]),
              _c("root_scale", np.float32(HEAD ** -0.25), np.float32), _c("zero", np.float32(0), np.float32)]
    n = helper.make_node
    nodes = [
        n("Shape", ["input_ids"], ["b"], start=0, end=1), n("Shape", ["input_ids"], ["s"], start=1, end=2),
        n("Gather", ["tok", "input_ids"], ["emb"]),
        n("Slice", ["pos_ids", "start", "s", "ax1"], ["positions"]),
        n("Gather", ["pos", "positions"], ["pos_emb"]),
        n("Add", ["emb", "pos_emb"], ["x"]),
        n("Concat", ["b", "s", "minus1", "head"], ["heads_shape"], axis=0),
    ]
    for t in "qkv":
        nodes += [n("MatMul", ["x", f"w{t}"], [f"{t}_proj"]), n("Reshape", [f"{t}_proj", "heads_shape"], [f"{t}4"]),
                  n("Transpose", [f"{t}4"], [f"{t}h"], perm=[0, 2, 1, 3])]
    nodes += [
        n("Shape", ["kh"], ["ks"]),
        n("Slice", ["ks", "i0", "i2"], ["ks_bn"]), n("Slice", ["ks", "i2", "i3"], ["ks_s"]),
        n("Slice", ["ks", "i3", "i4"], ["ks_h"]),
        n("Concat", ["minus1", "ks_s", "ks_h"], ["flat"], axis=0), n("Reshape", ["kh", "flat"], ["k3"]),
        n("Transpose", ["k3"], ["kt3"], perm=[0, 2, 1]),
        n("Concat", ["ks_bn", "ks_h", "ks_s"], ["unflat"], axis=0), n("Reshape", ["kt3", "unflat"], ["kt"]),
        n("Mul", ["qh", "root_scale"], ["qs"]), n("Mul", ["kt", "root_scale"], ["kts"]),
        n("MatMul", ["qs", "kts"], ["scores"]), n("Softmax", ["scores"], ["p"], axis=-1),
        n("IsNaN", ["p"], ["nan"]), n("Where", ["nan", "zero", "p"], ["p0"]),
        n("MatMul", ["p0", "vh"], ["ctx"]), n("Transpose", ["ctx"], ["ctx_bsnh"], perm=[0, 2, 1, 3]),
        n("Concat", ["b", "s", "minus1"], ["merged_shape"], axis=0),
        n("Reshape", ["ctx_bsnh", "merged_shape"], ["merged"]), n("MatMul", ["merged", "wo"], ["y"]),
    ]
    return make_model(nodes, [("input_ids", np.int64, ["batch", "seq"])], [("y", np.float32, ["batch", "seq", D])],
                      [*w.values(), *consts], opset=18)


def _dims(model, name):
    return infer_shapes(gs.import_onnx(model))[name][1]


def _feeds(batch, seq):
    return {"input_ids": np.random.default_rng(seq).integers(0, VOCAB, (batch, seq)).astype(np.int64)}


def test_a_prefix_slice_broadcast_keeps_the_sequence_length_and_the_slice_stays_unclaimed():
    model = _model()
    assert _dims(model, "x") == ["batch", "seq", D]
    assert _dims(model, "q4") == ["batch", "seq", D // HEAD, HEAD]  # the -1 solved: the head count
    assert "seq" not in _dims(model, "positions")  # min(seq, 16): not seq past the table


def test_a_slice_not_from_zero_is_no_prefix():
    """table[:, 1:seq] has seq - 1 rows: nothing may be named for the sum it broadcasts into."""
    assert _dims(_model(pos_start=1), "x")[1] != "seq"


def test_dynamo_style_attention_fuses_and_matches_onnxruntime():
    model = _model()
    result = optimize_model(model)
    assert result.ops_after.get("com.microsoft.MultiHeadAttention", 0) == 1
    for batch, seq in ((1, 1), (2, 7), (3, TABLE)):
        assert_matches_ort(model, result.model, feeds=_feeds(batch, seq), rtol=1e-5)


def test_view_minus_one_by_seq_is_the_batch():
    """input_ids.view(-1, seq) (CLIP's text embeddings): the -1 is the batch, names cancelling."""
    nodes = [helper.make_node("Shape", ["ids"], ["s"], start=1, end=2),
             helper.make_node("Concat", ["minus1", "s"], ["shape"], axis=0),
             helper.make_node("Reshape", ["ids", "shape"], ["flat"]),
             helper.make_node("Identity", ["flat"], ["out"])]
    model = make_model(nodes, [("ids", np.int64, ["batch", "seq"])], [("out", np.int64, ["batch", "seq"])], [_c("minus1", [-1])],
                       opset=18)
    assert _dims(model, "flat") == ["batch", "seq"]
