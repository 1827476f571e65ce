"""Models quantized by other tools, built into plans: QDQ (weights folded to float at lowering,
activation Quantize/Dequantize pairs fused into one pass) and QOperator (QLinearConv native and
exact, contrib QLinearAdd in onnxruntime islands whose input types ONNX's inference does not know)."""

import numpy as np
import pytest
from onnx import helper, numpy_helper

from infc.compiler.build import sample_run
from infc.compiler.build_precision import PrecisionSettings, reduce_precision
from infc.compiler.graph import import_graph
from infc.compiler.lower import lower_graph
from infc.compiler.optimize import optimize_model
from infc.compiler.runtime.executor import Executor
from infc.compiler.runtime.kernels import fake_quant, has_kernel, quant
from infc.compiler.runtime.kernels.common import KernelContext
from infc.compiler.verify import ort_session

RNG = np.random.default_rng(0)
F32 = np.float32


def _model(nodes, inputs, outputs, inits, opset=17, ms=False):
    graph = helper.make_graph(nodes, "q", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if ms else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def _qdq_conv_model():
    """x -> Q/DQ -> Conv(DQ(W int8 per channel), bias) -> Relu -> Q/DQ -> y"""
    w = RNG.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8)
    inits = {"w_q": w, "w_s": (RNG.random(8) * 0.02 + 0.01).astype(F32), "w_z": np.zeros(8, np.int8),
             "b": RNG.standard_normal(8).astype(F32), "x_s": np.array(0.05, F32), "x_z": np.array(3, np.int8),
             "y_s": np.array(0.08, F32), "y_z": np.array(0, np.uint8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"], axis=0),
             helper.make_node("Conv", ["xd", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "y_s", "y_z"], ["rq"]),
             helper.make_node("DequantizeLinear", ["rq", "y_s", "y_z"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", 1, ["n", 4, 10, 10])],
                  [helper.make_tensor_value_info("y", 1, None)], inits)


def _program(model, shape):
    """As `infc build` lowers it at fp32: QDQ weights dequantized by the precision step first."""
    step = reduce_precision(model, optimize_model(model).model, None, "fp32", PrecisionSettings())
    return lower_graph(import_graph(step.model), has_kernel)


def test_qdq_weights_fold_and_the_plan_matches_onnxruntime():
    model = _qdq_conv_model()
    program = _program(model, (2, 4, 10, 10))
    ops = [s["op"] for s in program.steps]
    assert "w_q" not in program.weights and "w" in program.weights and program.weights["w"].dtype == F32
    assert ops.count("DequantizeLinear") == 2  # the activations' pairs stay in the plan
    x = RNG.standard_normal((2, 4, 10, 10)).astype(F32) * 3
    names = [o["name"] for o in program.outputs]
    executor = Executor(program.steps, program.weights, program.opset, program.islands, output_names=names)
    assert sum(step.key == ("infc.cpu", "FakeQuantize") for step in executor._steps) == 2
    got = executor.run({"x": x})["y"]
    want = ort_session(model).run(["y"], {"x": x})[0]
    # the grid is 0.08 wide: a float32 sum that lands on the other side of a bin edge moves one step
    assert np.abs(got - want).max() <= 0.08 + 1e-6
    assert np.mean(got == want) > 0.99
    observed = Executor(program.steps, program.weights, program.opset, program.islands, output_names=names,
                        observer=lambda name, value: None)
    np.testing.assert_array_equal(observed.run({"x": x})["y"], got)  # the unfused pair, bit for bit


@pytest.mark.parametrize("zero_type", [np.int8, np.uint8])
def test_fake_quantize_is_bitwise_the_two_kernels(zero_type):
    x = (RNG.standard_normal(5000) * 40).astype(F32)
    x[:6] = [np.nan, np.inf, -np.inf, 3e9, -3e9, 0.5 * 0.1]  # NaN, saturation, past int32, a tie
    scale, zero = np.array(0.1, F32), np.array(7, zero_type)
    dq_scale, dq_zero = np.array(0.1, F32), np.array(7, zero_type)
    ctx = KernelContext(17, [None])
    q = quant.quantize_linear([x, scale, zero], {}, ctx)[0]
    expected = quant.dequantize_linear([q, dq_scale, dq_zero], {}, ctx)[0]
    fused = fake_quant.fake_quantize([x, scale, zero, dq_scale, dq_zero], {"quantize": {}, "dequantize": {}}, ctx)[0]
    np.testing.assert_array_equal(fused, expected)
    low = -128 if zero_type is np.int8 else 0
    assert q[0] == low and q[1] == (127 if zero_type is np.int8 else 255) and q[3] == q[1] and q[4] == low


def test_quantize_saturates_like_onnxruntime():
    x = np.array([np.inf, -np.inf, 1e10, -1e10, 12.7, -12.9], F32)
    model = _model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])],
                   [helper.make_tensor_value_info("x", 1, [6])], [helper.make_tensor_value_info("y", 3, [6])],
                   {"s": np.array(0.1, F32), "z": np.array(0, np.int8)})
    want = ort_session(model).run(["y"], {"x": x})[0]
    got = quant.quantize_linear([x, np.array(0.1, F32), np.array(0, np.int8)], {}, KernelContext(17, [None]))[0]
    np.testing.assert_array_equal(got, want)


def test_qoperator_model_with_contrib_islands_runs_and_is_exact():
    """QuantizeLinear -> QLinearAdd (contrib: an island) -> QLinearConv (native) -> QLinearAdd (an
    island whose input type ONNX's inference lost) -> DequantizeLinear."""
    w = RNG.integers(-64, 65, (6, 6, 3, 3)).astype(np.int8)  # onnxruntime exact on any x86 (quantize/weight_range.py)
    inits = {"s": np.array(0.05, F32), "z": np.array(128, np.uint8), "ws": np.array(0.01, F32),
             "wz": np.array(0, np.int8), "w": w, "bias": RNG.integers(-500, 500, 6).astype(np.int32),
             "s2": np.array(0.2, F32), "z2": np.array(100, np.uint8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q1"]),
             helper.make_node("QLinearAdd", ["q1", "s", "z", "q1", "s", "z", "s", "z"], ["q2"], domain="com.microsoft"),
             helper.make_node("QLinearConv", ["q2", "s", "z", "w", "ws", "wz", "s2", "z2", "bias"], ["q3"], pads=[1, 1, 1, 1]),
             helper.make_node("QLinearAdd", ["q3", "s2", "z2", "q3", "s2", "z2", "s2", "z2"], ["q4"], domain="com.microsoft"),
             helper.make_node("DequantizeLinear", ["q4", "s2", "z2"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", 1, [1, 6, 9, 9])],
                   [helper.make_tensor_value_info("y", 1, None)], inits, ms=True)
    program = _program(model, (1, 6, 9, 9))
    assert [s["op"] for s in program.steps].count("__island__") == 2
    x = RNG.standard_normal((1, 6, 9, 9)).astype(F32) * 2
    names = [o["name"] for o in program.outputs]
    got = Executor(program.steps, program.weights, program.opset, program.islands, output_names=names).run({"x": x})["y"]
    _, shapes = sample_run(program, {"x": x})  # the build's observing run creates the sessions the same way
    assert shapes["y"][0] == (1, 6, 9, 9)
    # the integer sums are exact and requantized with onnxruntime's float32 multiplier: identical
    # (these round scales put many values on exact halves, where any other order of the float
    # arithmetic rounds some of them to the neighbouring grid point)
    np.testing.assert_array_equal(got, ort_session(model).run(["y"], {"x": x})[0])


@pytest.mark.parametrize("m,k,n", [(3, 5000, 7), (2, 513, 1100), (64, 40, 9)])
def test_integer_matmul_is_exact_past_float32_integers(m, k, n):
    # extreme 8-bit values: partial sums pass 2^24 unless K is chunked
    a = np.where(RNG.random((2, m, k)) < 0.5, 0, 255).astype(np.uint8)
    b = np.where(RNG.random((k, n)) < 0.5, -128, 127).astype(np.int8)
    zero_a, zero_b = np.array(0, np.uint8), np.array(0, np.int8)
    ctx = KernelContext(17, [None])
    got = quant.matmul_integer([a, b, zero_a, zero_b], {}, ctx)[0]
    np.testing.assert_array_equal(got, (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32))
    again = quant.matmul_integer([a, b, zero_a, zero_b], {}, ctx)[0]  # the weight side from the memo
    np.testing.assert_array_equal(again, got)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("kind", ["normal", "positive", "negative", "ties", "nan"])
def test_dynamic_quantize_matches_onnxruntime(kind):
    x = {"normal": RNG.standard_normal((33, 65)) * 3, "positive": np.abs(RNG.standard_normal((7, 9))),
         "negative": -np.abs(RNG.standard_normal((7, 9))), "ties": np.tile([0.5, 1.5, 2.5, -2.5], 8) * 2 / 255,
         "nan": np.array([1.0, np.nan, -2.0])}[kind].astype(F32)
    model = _model([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])],
                   [helper.make_tensor_value_info("x", 1, list(x.shape))],
                   [helper.make_tensor_value_info("y", 2, None), helper.make_tensor_value_info("s", 1, None),
                    helper.make_tensor_value_info("z", 2, None)], {})
    got = quant.dynamic_quantize_linear([x], {}, KernelContext(17, [None]))
    if kind == "nan":  # onnxruntime's NaN handling is its own; infc takes the NumPy form there and must not crash
        assert got[0].shape == x.shape
        return
    for g, w in zip(got, ort_session(model).run(["y", "s", "z"], {"x": x})):
        np.testing.assert_array_equal(g, w)


def test_qoperator_steps_and_their_islands_run_as_one_onnxruntime_session():
    """The QLinearConv is marked for onnxruntime's int8 kernels (untimed); the QuantizeLinear, the
    contrib islands and the DequantizeLinear around it bridge, so the whole program is one session
    (the islands' subgraphs spliced in), and it still matches onnxruntime exactly."""
    from infc.compiler import tune_context, tune_vendor
    from infc.compiler.tune_bridge import bridge_candidates, input_dtypes, with_bridges

    w = RNG.integers(-64, 65, (6, 6, 3, 3)).astype(np.int8)  # onnxruntime exact on any x86 (quantize/weight_range.py)
    inits = {"s": np.array(0.05, F32), "z": np.array(128, np.uint8), "ws": np.array(0.01, F32),
             "wz": np.array(0, np.int8), "w": w, "s2": np.array(0.2, F32), "z2": np.array(100, np.uint8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q1"]),
             helper.make_node("QLinearAdd", ["q1", "s", "z", "q1", "s", "z", "s", "z"], ["q2"], domain="com.microsoft"),
             helper.make_node("QLinearConv", ["q2", "s", "z", "w", "ws", "wz", "s2", "z2"], ["q3"], pads=[1, 1, 1, 1]),
             helper.make_node("QLinearAdd", ["q3", "s2", "z2", "q3", "s2", "z2", "s2", "z2"], ["q4"], domain="com.microsoft"),
             helper.make_node("DequantizeLinear", ["q4", "s2", "z2"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", 1, [1, 6, 9, 9])],
                   [helper.make_tensor_value_info("y", 1, None)], inits, ms=True)
    program = _program(model, (1, 6, 9, 9))
    x = RNG.standard_normal((1, 6, 9, 9)).astype(F32) * 2
    _, shapes = sample_run(program, {"x": x})
    seen = {"opt": {"x": ((1, 6, 9, 9), "float32"), **shapes}}
    tune_vendor._mark_untimed_steps(program)
    marked = frozenset(i for i, s in enumerate(program.steps) if s.get("tactic"))
    assert [program.steps[i]["op"] for i in marked] == ["QLinearConv"]
    keep = with_bridges(len(program.steps), marked, bridge_candidates(program, seen))
    assert len(keep) == len(program.steps)
    dtypes = {i: input_dtypes(program.steps[i], seen, program.weights) for i in keep}
    steps = tune_context._with_marks(program.steps, keep, dtypes)
    names = [o["name"] for o in program.outputs]
    executor = Executor(steps, program.weights, program.opset, program.islands, output_names=names)
    assert not executor.notes, executor.notes
    assert len(executor._steps) == 1
    np.testing.assert_array_equal(executor.run({"x": x})["y"], ort_session(model).run(["y"], {"x": x})[0])
