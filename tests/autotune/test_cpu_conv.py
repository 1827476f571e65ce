"""Convolution tactics: both candidates (infc's kernel, onnxruntime's) pass the tuner's float64 check on
every geometry, and the key separates what changes the timing and merges what does not."""

import numpy as np
import pytest

from infc.compiler.autotune import cpu_conv
from infc.compiler.autotune.tuner import tune

RNG = np.random.default_rng(0)

# (op, domain, attrs, x shape, w shape, has bias, has residual)
CASES = [
    ("Conv", "", {"pads": [1, 1, 1, 1]}, (2, 8, 9, 11), (16, 8, 3, 3), True, False),
    ("Conv", "", {"strides": [2, 2], "pads": [3, 3, 3, 3]}, (1, 3, 30, 30), (8, 3, 7, 7), True, False),
    ("Conv", "", {"group": 4, "pads": [0, 1, 0, 1]}, (1, 8, 10, 10), (8, 2, 3, 3), False, False),
    ("Conv", "", {"group": 8, "pads": [1, 1, 1, 1]}, (1, 8, 10, 10), (8, 1, 3, 3), True, False),  # depthwise
    ("Conv", "", {"dilations": [2, 2], "pads": [2, 1, 2, 1]}, (1, 4, 12, 12), (6, 4, 3, 3), True, False),
    ("Conv", "", {"pads": [2, 2]}, (2, 4, 40), (6, 4, 5), True, False),  # 1-D
    ("FusedConv", "com.microsoft", {"activation": "Relu", "pads": [1, 1, 1, 1]}, (1, 8, 12, 12), (8, 8, 3, 3), True, True),
    ("FusedConv", "com.microsoft", {"activation": "LeakyRelu", "activation_params": [0.2]}, (1, 16, 7, 7),
     (32, 16, 1, 1), False, True),
    ("FusedConv", "com.microsoft", {"activation": "HardSigmoid", "activation_params": [0.25, 0.4], "strides": [2, 2]},
     (1, 4, 15, 15), (8, 4, 3, 3), True, False),
]


def _problem(op, domain, attrs, x_shape, w_shape, has_bias, has_residual):
    w = (RNG.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    bias = RNG.standard_normal(w_shape[0]).astype(np.float32) if has_bias else None
    key = cpu_conv.conv_key(x_shape, w_shape, attrs, has_bias, has_residual, "test-target", sources="test")
    out_shape = None
    if has_residual:  # the residual has the output's shape: one reference run tells it
        plain = cpu_conv.conv_problem(key, op, domain, attrs, x_shape, w, bias, None, opset=17)
        out_shape = plain.reference().shape
    return cpu_conv.conv_problem(key, op, domain, attrs, x_shape, w, bias, out_shape, opset=17)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[4]))}-{sorted(c[2])}")
def test_both_tactics_pass_the_float64_check(case):
    problem = _problem(*case)
    result = tune(problem, lambda run: [1e-3], rounds=1, confirm_rounds=0)
    statuses = {str(c.config): c.status for c in result.candidates}
    assert statuses == {"onnxruntime": "ok", "onnxruntime(threads=1)": "ok", "infc": "ok"}, statuses
    assert result.winner == cpu_conv.VENDOR  # a tie goes to the vendor


def test_a_tactic_onnxruntime_refuses_fails_and_infc_wins():
    # onnxruntime has no dilated convolution with auto_pad SAME_*; infc's kernel has
    problem = _problem("Conv", "", {"dilations": [2, 2], "auto_pad": "SAME_UPPER"}, (1, 4, 12, 12), (6, 4, 3, 3), True, False)
    result = tune(problem, lambda run: [1e-3], rounds=1, confirm_rounds=0)
    assert result.result_of(cpu_conv.VENDOR).status.startswith("failed: ")
    assert result.result_of(cpu_conv.NATIVE).status == "ok"
    assert result.winner == cpu_conv.NATIVE


def test_a_wrong_candidate_scores_as_wrong():
    problem = _problem(*CASES[0])
    broken = problem.build

    def build(config):
        run = broken(config)
        return (lambda: run() * 1.01) if config == cpu_conv.NATIVE else run

    result = tune(type(problem)(problem.key, problem.vendor, problem.configs, build, problem.reference,
                                out_dtype="float32"), lambda run: [1e-3], rounds=1, confirm_rounds=0)
    native = result.result_of(cpu_conv.NATIVE)
    assert native.status.startswith("wrong: max error"), native.status
    assert result.winner == cpu_conv.VENDOR


def _key(attrs, x_shape=(1, 4, 12, 12), w_shape=(6, 4, 3, 3), bias=True, residual=False):
    return str(cpu_conv.conv_key(x_shape, w_shape, attrs, bias, residual, "t", sources="s"))


def test_key_resolves_auto_pad_to_explicit_pads():
    assert _key({"auto_pad": "SAME_UPPER"}) == _key({"pads": [1, 1, 1, 1]})
    assert _key({"pads": [1, 1, 1, 1]}) != _key({"pads": [0, 0, 0, 0]})


def test_key_holds_epilogue_and_geometry():
    base = _key({"activation": "LeakyRelu", "activation_params": [0.1]})
    assert base != _key({"activation": "LeakyRelu", "activation_params": [0.2]})
    assert base != _key({"activation": "LeakyRelu", "activation_params": [0.1]}, residual=True)
    assert base != _key({"activation": "LeakyRelu", "activation_params": [0.1]}, bias=False)
    assert _key({}) != _key({"strides": [2, 2]})
    assert _key({}) != _key({}, x_shape=(2, 4, 12, 12))
    assert "LeakyRelu(0.1)+bias" in base
