"""Lengths after convolutions, as dynamo computes them for its Reshapes (len // 20 - 1 after strides 5,
2, 2) and as symbolic_lengths.py names Conv outputs: equal names, so wav2vec2-style attention over
conv features fuses, and stays exact at every length."""

import re

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from onnx import helper

from infc.compiler.optimize import optimize_model
from infc.compiler.passes.fold.dim_forms import floor_divided, shifted
from infc.compiler.passes.fold.shape_inference import infer_shapes
from infc.compiler.testing import assert_matches_ort, make_model

C, HEADS, HEAD = 16, 2, 8


def _value(form: str, n: int) -> int:
    """A dim_forms name (base // q + c, the base a name or a parenthesized form) evaluated at name = n."""
    inner = re.fullmatch(r"\((.*)\)(?://(\d+))?([+-]\d+)?", form)
    if inner is not None:
        return _value(inner[1], n) // int(inner[2] or 1) + int(inner[3] or 0)
    base, q, c = re.fullmatch(r"(\w+)(?://(\d+))?([+-]\d+)?", form).groups()
    return n // int(q or 1) + int(c or 0)


@pytest.mark.parametrize("kernel, stride, pad", [(10, 5, 0), (3, 2, 0), (16, 1, 8), (4, 4, 0), (5, 1, 2), (2, 2, 0)])
def test_the_form_equals_a_convolution_length_wherever_it_exists(kernel, stride, pad):
    for first in ("len", "len//5-1", "(len//20+1)//2-1"):
        form = shifted(floor_divided(shifted(first, 2 * pad - kernel), stride), 1)
        for n in range(60, 400):
            size = _value(first, n)
            assert _value(form, n) == (size + 2 * pad - kernel) // stride + 1, (form, n)


def test_a_stride_that_does_not_divide_the_constant_keeps_its_remainder_inside():
    """SEW-D's AveragePool(2, 2) after the conv front end: (x - 2) // 2 + 1 as the pool computes it and
    (x) // 2 as an exporter may write it get one name; a dividing stride still merges."""
    x = "len//20-1"
    assert shifted(floor_divided(shifted(x, -2), 2), 1) == floor_divided(x, 2) == "(len//20+1)//2-1"
    assert floor_divided("len//4-2", 2) == "len//8-1"


def _model():
    """Two strided 1-D convolutions over raw samples, features reshaped into heads with the length
    computed from the input's Shape (len // 10 - 1, as torch simplifies it), self-attention over
    them with a mask expanded from Range(0, that length), and the heads merged back."""
    rng = np.random.default_rng(0)
    w = {"w1": rng.standard_normal((C, 1, 10)) * 0.3, "w2": rng.standard_normal((C, C, 3)) * 0.3,
         **{f"w{t}": rng.standard_normal((C, C)) * 0.3 for t in "qkv"}}
    consts = {k: v.astype(np.float32) for k, v in w.items()} | {
        "ten": np.array(10, np.int64), "minus1": np.array(-1, np.int64), "flat": np.array([-1], np.int64),
        "heads": np.array([HEADS], np.int64), "head": np.array([HEAD], np.int64), "one": np.array([1], np.int64),
        "zero": np.array(0, np.int64), "step": np.array(1, np.int64), "axes01": np.array([0, 1], np.int64),
        "axis3": np.array([3], np.int64), "scale": np.array(HEAD ** -0.5, np.float32),
        "visible": np.array(0, np.float32), "hidden": np.array(-np.inf, np.float32)}
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1"], ["c1"], strides=[5]), n("Conv", ["c1", "w2"], ["c2"], strides=[2]),
        n("Transpose", ["c2"], ["feats"], perm=[0, 2, 1]),
        n("Shape", ["x"], ["b"], start=0, end=1), n("Shape", ["x"], ["len1"], start=2, end=3),
        n("Squeeze", ["len1"], ["len"]), n("Div", ["len", "ten"], ["len10"]),
        n("Add", ["minus1", "len10"], ["frames"]), n("Reshape", ["frames", "flat"], ["frames1"]),
        n("Concat", ["b", "frames1", "heads", "head"], ["heads_shape"], axis=0),
        n("Concat", ["b", "frames1", "flat"], ["merged_shape"], axis=0),
        n("Range", ["zero", "frames", "step"], ["positions"]),
        n("Unsqueeze", ["positions", "axes01"], ["rows"]), n("Unsqueeze", ["rows", "axis3"], ["rows4"]),
        n("GreaterOrEqual", ["rows4", "zero"], ["keep"]),
        n("Concat", ["b", "one", "frames1", "frames1"], ["mask_shape"], axis=0),
        n("Expand", ["keep", "mask_shape"], ["keep4"]),
        n("Where", ["keep4", "visible", "hidden"], ["bias"]),
    ]
    for t in "qkv":
        nodes += [n("MatMul", ["feats", f"w{t}"], [f"{t}3"]), n("Reshape", [f"{t}3", "heads_shape"], [f"{t}4"]),
                  n("Transpose", [f"{t}4"], [f"{t}h"], perm=[0, 2, 3, 1] if t == "k" else [0, 2, 1, 3])]
    nodes += [
        n("MatMul", ["qh", "kh"], ["qk"]), n("Mul", ["qk", "scale"], ["scores"]), n("Add", ["scores", "bias"], ["masked"]),
        n("Softmax", ["masked"], ["p"], axis=-1), n("MatMul", ["p", "vh"], ["ctx"]),
        n("Transpose", ["ctx"], ["ctx_bsnh"], perm=[0, 2, 1, 3]), n("Reshape", ["ctx_bsnh", "merged_shape"], ["y"]),
    ]
    return make_model(nodes, [("x", np.float32, ["batch", 1, "samples"])], [("y", np.float32, ["batch", "t", C])],
                      consts, opset=18)


def test_conv_lengths_and_the_exporters_arithmetic_get_one_name():
    found = infer_shapes(gs.import_onnx(_model()))
    assert found["c2"][1] == ["batch", C, "samples//10-1"]
    assert found["q4"][1] == ["batch", "samples//10-1", HEADS, HEAD]  # the head count: known
    assert found["positions"][1] == ["samples//10-1"]
    assert found["masked"][1] == ["batch", HEADS, "samples//10-1", "samples//10-1"]


def test_attention_over_conv_features_fuses_and_matches_onnxruntime():
    model = _model()
    result = optimize_model(model)
    assert result.ops_after.get("com.microsoft.MultiHeadAttention", 0) == 1
    for batch, samples in ((1, 40), (2, 97), (1, 333)):
        x = np.random.default_rng(samples).standard_normal((batch, 1, samples)).astype(np.float32)
        assert_matches_ort(model, result.model, feeds={"x": x}, rtol=1e-5)


def test_a_trim_of_the_last_frame_shortens_the_length_by_one():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[8, 8]),
             helper.make_node("Slice", ["c", "start", "end", "axis"], ["trimmed"]),
             helper.make_node("Relu", ["trimmed"], ["y"])]
    consts = {"w": np.ones((1, 1, 16), np.float32), "start": np.array([0], np.int64),
              "end": np.array([-1], np.int64), "axis": np.array([2], np.int64)}
    model = make_model(nodes, [("x", np.float32, ["batch", 1, "len"])], [("y", np.float32, ["batch", 1, "t"])],
                       consts, opset=18)
    found = infer_shapes(gs.import_onnx(model))
    assert found["c"][1] == ["batch", 1, "len+1"] and found["trimmed"][1] == ["batch", 1, "len"]


def test_a_prefix_slice_to_its_own_length_keeps_every_dim():
    """rel_pos[:query_size, :] (DeBERTa): Slice(x, 0, Shape(x)[0]) along axis 0 keeps x's shape; onnx
    drops all dims when an end is not a constant."""
    n = helper.make_node
    nodes = [n("Shape", ["x"], ["rows"], start=0, end=1), n("Slice", ["x", "zero1", "rows", "zero1", "one1"], ["y"]),
             n("Identity", ["y"], ["out"])]
    inits = {"zero1": np.array([0], np.int64), "one1": np.array([1], np.int64)}
    model = make_model(nodes, [("x", np.float32, ["n", "m"])], [("out", np.float32, [None, None])], inits)
    assert infer_shapes(gs.import_onnx(model))["y"][1] == ["n", "m"]


def test_a_default_mask_over_computed_lengths_keeps_their_names():
    """torch.ones(b, frames) with frames computed (SEW-D without an attention mask): ConstantOfShape's
    output gets the shape walk's names, which onnx leaves unknown."""
    n = helper.make_node
    nodes = [n("Shape", ["x"], ["b"], start=0, end=1), n("Shape", ["x"], ["len1"], start=1, end=2),
             n("Div", ["len1", "two"], ["half"]), n("Concat", ["b", "half"], ["shape"], axis=0),
             n("ConstantOfShape", ["shape"], ["ones"]), n("Identity", ["ones"], ["out"])]
    model = make_model(nodes, [("x", np.float32, ["b", "len"])], [("out", np.float32, [None, None])],
                       {"two": np.array([2], np.int64)})
    assert infer_shapes(gs.import_onnx(model))["ones"][1] == ["b", "len//2"]
