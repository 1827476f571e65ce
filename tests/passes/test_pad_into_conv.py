"""A zero Pad of the spatial axes folded into the Conv after it (fold/pad_into_conv.py)."""

import numpy as np
import pytest
from infc.compiler.passes.fold import pad_into_conv
from infc.compiler.testing import (
    assert_matches_ort,
    make_model,
    ops_of,
    rule_stats,
    run_rules,
)
from onnx import helper

F32 = np.float32
RNG = np.random.default_rng(0)
RULE = "fold_pad_into_conv"


def _model(pads, opset=17, value=None, mode=None, conv_attrs=None, axes=None):
    """x [1, 3, 9, 8] -> Pad -> Conv(4 x 3 x 3 x 3, stride 2)."""
    inits = {"w": RNG.standard_normal((4, 3, 3, 3)).astype(F32), "b": RNG.standard_normal(4).astype(F32)}
    attrs = {"mode": mode} if mode else {}
    if opset < 11:
        pad = helper.make_node("Pad", ["x"], ["p"], pads=pads, **({"value": value} if value is not None else {}), **attrs)
    else:
        inits["pads"] = np.array(pads, np.int64)
        names = ["x", "pads"]
        if value is not None or axes is not None:
            names.append("value" if value is not None else "")
            if value is not None:
                inits["value"] = np.array(value, F32)
        if axes is not None:
            names.append("axes")
            inits["axes"] = np.array(axes, np.int64)
        pad = helper.make_node("Pad", names, ["p"], **attrs)
    conv = helper.make_node("Conv", ["p", "w", "b"], ["y"], strides=[2, 2], **(conv_attrs or {}))
    return make_model([pad, conv], [("x", F32, [1, 3, 9, 8])], [("y", F32, [1, 4, None, None])], inits, opset=opset)


@pytest.mark.parametrize("model", [
    _model([0, 0, 1, 0, 0, 0, 2, 1]),  # TF "same": more at the end
    _model([0, 0, 1, 1, 0, 0, 1, 1], opset=10),  # pads as attributes
    _model([0, 0, 1, 2, 0, 0, 1, 0], value=0.0, conv_attrs={"pads": [1, 0, 0, 1]}),  # adds to the Conv's own pads
    _model([1, 0, 2, 1], axes=[2, 3], opset=18),  # pads over named axes
], ids=["same", "opset10", "own_pads", "axes"])
def test_zero_pad_folds_into_conv(model):
    result = run_rules(model, pad_into_conv.RULES)
    assert rule_stats(result, RULE)[0] == 1
    assert ops_of(result.model) == ["Conv"]
    assert_matches_ort(model, result.model)


@pytest.mark.parametrize("model,reason", [
    (_model([0, 0, 1, 1, 0, 0, 1, 1], value=1.0), "Pad value is not a constant zero"),
    (_model([0, 0, 1, 1, 0, 0, 1, 1], mode="reflect"), "Pad mode is not constant"),
    (_model([0, 1, 1, 1, 0, 0, 1, 1]), "Pad pads the batch or channel axis"),
    (_model([0, 0, -1, 0, 0, 0, 1, 1]), "Pad crops (negative pads)"),
    (_model([0, 0, 1, 1, 0, 0, 1, 1], conv_attrs={"auto_pad": "SAME_UPPER"}), "Conv has SAME auto_pad"),
])
def test_declines_with_reason(model, reason):
    result = run_rules(model, pad_into_conv.RULES)
    assert rule_stats(result, RULE) == (0, {reason: 1})
