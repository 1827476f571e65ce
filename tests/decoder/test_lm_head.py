"""The LM head found by structure (compiler/decoder/lm_head.py): the GEMM whose output reaches the
logits through data movement and scaling by constants, whatever the weights are called."""

import numpy as np

from infc.compiler.decoder.lm_head import keeps_head_fp32, lm_head_weight
from infc.compiler.lower import Program


def _step(op, inputs, output, domain="", **attrs):
    return {"op": op, "domain": domain, "name": output, "inputs": inputs, "outputs": [output], "attrs": attrs}


def _gemm(x, w, y):
    return _step("BatchInvariant", [x, w], y, "infc", inner_op="MatMul", inner_domain="", const_inputs=[1])


def _program(tail: list[dict]) -> Program:
    weights = {name: np.ones((8, 8), np.float32) for name in ("mlp_w", "zz_projection", "scale")}
    weights["shape"] = np.array([1, -1, 8], np.int64)
    steps = [_gemm("x", "mlp_w", "h"), _gemm("h", "zz_projection", "y"), *tail]
    return Program(steps, weights, [], [], 17, {})


def test_the_head_is_found_through_casts_reshapes_and_constant_scaling():
    tail = [_step("Reshape", ["y", "dims"], "r"), _step("Div", ["r", "scale"], "d"), _step("Tanh", ["d"], "t"),
            _step("Mul", ["t", "scale"], "m"), _step("Cast", ["m"], "logits", to=1)]
    assert lm_head_weight(_program(tail), "logits") == "zz_projection"
    assert lm_head_weight(_program([_step("Identity", ["y"], "logits")]), "logits") == "zz_projection"


def test_no_head_when_the_logits_mix_two_runtime_values_or_come_from_no_gemm():
    assert lm_head_weight(_program([_step("Add", ["y", "h"], "logits")]), "logits") is None
    assert lm_head_weight(_program([_step("Softmax", ["y"], "logits")]), "logits") is None
    assert lm_head_weight(_program([]), "missing") is None


def test_lm_head_choice_per_precision():
    assert keeps_head_fp32("auto", "int8") is True and keeps_head_fp32("auto", "w8") is None
    assert keeps_head_fp32("fp32", "w8") is True and keeps_head_fp32("int8", "int8") is False
