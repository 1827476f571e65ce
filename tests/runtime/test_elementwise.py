import contextlib

import numpy as np
import pytest

F32 = np.float32

BINARY = ["Add", "Sub", "Mul", "Div"]


@pytest.mark.parametrize("op", BINARY + ["Pow", "Max", "Min"])
@pytest.mark.parametrize("shapes", [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 5)), ((), (2, 2))])
def test_float_binary_broadcasting(op, shapes, rng, single_node, ort_check):
    a = np.asarray(rng.standard_normal(shapes[0]), dtype=F32)
    b = np.asarray(rng.standard_normal(shapes[1]), dtype=F32)
    if op == "Pow":
        a = np.asarray(np.abs(a) + 0.1, dtype=F32)
    ort_check(single_node(op, {"a": a, "b": b}, [("y", F32)], opset=13), {"a": a, "b": b})


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.int8])
@pytest.mark.parametrize("op", BINARY)
def test_integer_binary(op, dtype, rng, single_node, ort_check):
    low = 0 if np.dtype(dtype).kind == "u" else -20
    a = rng.integers(low, 20, (3, 5)).astype(dtype)
    b = rng.integers(1, 7, (5,)).astype(dtype)
    if np.dtype(dtype).kind == "i":
        b = b * np.where(rng.random(5) < 0.5, -1, 1).astype(dtype)
    ort_check(single_node(op, {"a": a, "b": b}, [("y", dtype)], opset=14), {"a": a, "b": b})


@pytest.mark.parametrize("fmod,dtype", [(0, np.int32), (1, np.int32), (1, F32), (0, np.int64)])
def test_mod(fmod, dtype, rng, single_node, ort_check):
    a = (rng.standard_normal((4, 6)) * 20).astype(dtype)
    b = np.array([3, -4, 5, -7, 2, 9], dtype=dtype)
    ort_check(single_node("Mod", {"a": a, "b": b}, [("y", dtype)], {"fmod": fmod}, opset=13), {"a": a, "b": b})


@pytest.mark.parametrize("base,exponent", [(F32, np.int64), (np.int64, np.int64), (np.int32, F32), (F32, np.int32)])
def test_pow_mixed_types(base, exponent, single_node, ort_check):
    a = np.array([[1, 2, 3], [4, 5, 6]], dtype=base)
    b = np.array([2, 3, 1], dtype=exponent)
    ort_check(single_node("Pow", {"a": a, "b": b}, [("y", base)], opset=15), {"a": a, "b": b})


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [F32, np.int64])
def test_comparisons(op, dtype, rng, single_node, ort_check):
    a = rng.integers(-3, 3, (2, 3, 4)).astype(dtype)
    b = rng.integers(-3, 3, (3, 1)).astype(dtype)
    ort_check(single_node(op, {"a": a, "b": b}, [("y", bool)], opset=16), {"a": a, "b": b})


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logical(op, rng, single_node, ort_check):
    a, b = rng.random((3, 4)) < 0.5, rng.random((4,)) < 0.5
    ort_check(single_node(op, {"a": a, "b": b}, [("y", bool)]), {"a": a, "b": b})


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
def test_bitwise(op, rng, single_node, ort_check):
    a = rng.integers(0, 255, (3, 4)).astype(np.uint8)
    b = rng.integers(0, 255, (4,)).astype(np.uint8)
    ort_check(single_node(op, {"a": a, "b": b}, [("y", np.uint8)], opset=18), {"a": a, "b": b})


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bit_shift(direction, single_node, ort_check):
    a = np.array([16, 4, 1, 255], dtype=np.uint32)
    b = np.array([1, 2, 3, 4], dtype=np.uint32)
    ort_check(single_node("BitShift", {"a": a, "b": b}, [("y", np.uint32)], {"direction": direction}), {"a": a, "b": b})


UNARY = ["Abs", "Neg", "Exp", "Sqrt", "Log", "Reciprocal", "Ceil", "Floor", "Round", "Sign", "Sin", "Cos", "Tan",
         "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Erf"]


@pytest.mark.parametrize("op", UNARY)
def test_float_unary(op, rng, single_node, ort_check):
    x = rng.standard_normal((3, 17)).astype(F32) * 2
    if op in ("Sqrt", "Log"):
        x = np.abs(x) + 0.01
    if op in ("Asin", "Acos", "Atanh"):
        x = np.tanh(x) * 0.99
    if op == "Acosh":
        x = np.abs(x) + 1
    if op == "Round":
        x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4, -2.6], dtype=F32)
    ort_check(single_node(op, {"x": x}, [("y", F32)], opset=13), {"x": x})


def test_erf_wide_range(single_node, ort_check):
    x = np.concatenate([np.linspace(-6, 6, 4001), np.geomspace(1e-8, 0.5, 300)]).astype(F32)
    ort_check(single_node("Erf", {"x": x}, [("y", F32)], opset=13), {"x": x})


def test_not_isnan_isinf(single_node, ort_check):
    x = np.array([1.0, np.nan, np.inf, -np.inf, 0.0], dtype=F32)
    ort_check(single_node("IsNaN", {"x": x}, [("y", bool)], opset=13), {"x": x})
    for pos, neg in [(1, 1), (1, 0), (0, 1)]:
        model = single_node("IsInf", {"x": x}, [("y", bool)], {"detect_positive": pos, "detect_negative": neg}, opset=10)
        ort_check(model, {"x": x})
    b = np.array([True, False])
    ort_check(single_node("Not", {"b": b}, [("y", bool)]), {"b": b})


def test_where_broadcasts(rng, single_node, ort_check):
    c = rng.random((3, 1)) < 0.5
    a, b = rng.standard_normal((1, 4)).astype(F32), rng.standard_normal((3, 4)).astype(F32)
    ort_check(single_node("Where", {"c": c, "a": a, "b": b}, [("y", F32)]), {"c": c, "a": a, "b": b})


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("count", [1, 3])
def test_variadic(op, count, rng, single_node, ort_check):
    feeds = {f"x{i}": rng.standard_normal((2, 3) if i else (3,)).astype(F32) for i in range(count)}
    ort_check(single_node(op, feeds, [("y", F32)], opset=13), feeds)


def test_ieee_specials_are_values_not_warnings(graph_of, ort_check):
    # T5's relative-position buckets: log(0) = -inf, cast to an integer, then masked away by Where.
    # onnxruntime prints nothing; neither may infc (a RuntimeWarning per kernel on every run).
    import warnings

    from onnx import helper

    x = np.array([0.0, 1.0, 4.0, 0.0], F32)
    nodes = [helper.make_node("Log", ["x"], ["log"]), helper.make_node("Div", ["x", "x"], ["ratio"]),
             helper.make_node("Cast", ["log"], ["bucket"], to=7),
             helper.make_node("Equal", ["ratio", "ratio"], ["is_number"]),
             helper.make_node("Cast", ["x"], ["x64"], to=7),
             helper.make_node("Where", ["is_number", "bucket", "x64"], ["y"])]
    model = graph_of(nodes, {"x": x}, [("y", np.int64)])
    with warnings.catch_warnings(record=True) as caught:  # the filters as they stand, recorded
        ort_check(model, {"x": x})
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in caught]


@pytest.mark.parametrize("compiled", [True, False])
def test_float64_erf_and_gelu_keep_float64_accuracy(compiled, rng, single_node, native):
    # the float32 fits are 1e-7 off: a float64 model (scientific code) wants libm's erf
    import math

    from infc.compiler.runtime import jit

    x = np.concatenate([rng.standard_normal(200) * 3, [0.0, -1e-9, 6.0, -30.0, np.inf, -np.inf]])
    expected_erf = np.array([math.erf(v) for v in x])
    finite = x[:-2]
    expected_gelu = finite * 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in finite]))
    with jit.disabled() if not compiled else contextlib.nullcontext():
        erf = native(single_node("Erf", {"x": x}, [("y", np.float64)], opset=13), {"x": x})["y"]
        gelu = native(single_node("Gelu", {"x": finite}, [("y", np.float64)], opset=20), {"x": finite})["y"]
    assert erf.dtype == gelu.dtype == np.float64
    np.testing.assert_allclose(erf, expected_erf, rtol=1e-14, atol=1e-300)
    np.testing.assert_allclose(gelu, expected_gelu, rtol=1e-14, atol=1e-300)
