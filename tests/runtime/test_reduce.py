import numpy as np
import pytest

F32 = np.float32
REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
          "ReduceLogSumExp", "ReduceSumSquare"]


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([0, 2], 0), ([-1], 1), (None, 0), ([1, 2], 1)])
def test_reductions_axes_as_input(op, axes, keepdims, rng, single_node, ort_check):
    x = (rng.random((3, 4, 5)) + 0.5).astype(F32)
    inits = {"axes": np.array(axes, np.int64)} if axes is not None else {}
    ort_check(single_node(op, {"x": x}, [("y", F32)], {"keepdims": keepdims}, inits, opset=18), {"x": x})


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceMax", "ReduceSum"])
def test_reductions_axes_as_attribute(op, rng, single_node, ort_check):
    x = rng.standard_normal((2, 3, 4)).astype(F32)
    opset = 11 if op == "ReduceSum" else 13
    ort_check(single_node(op, {"x": x}, [("y", F32)], {"axes": [1, 2], "keepdims": 0}, opset=opset), {"x": x})


def test_noop_with_empty_axes(rng, single_node, ort_check):
    x = rng.standard_normal((2, 3)).astype(F32)
    model = single_node("ReduceSum", {"x": x}, [("y", F32)], {"noop_with_empty_axes": 1},
                        {"axes": np.array([], np.int64)}, opset=13)
    ort_check(model, {"x": x})


def test_integer_reductions(rng, single_node, ort_check):
    x = rng.integers(-5, 5, (4, 6)).astype(np.int64)
    for op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"):
        ort_check(single_node(op, {"x": x}, [("y", np.int64)], {"keepdims": 0}, {"axes": np.array([1])}, opset=18), {"x": x})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("attrs", [{}, {"axis": 1, "keepdims": 0}, {"axis": -1, "select_last_index": 1}])
def test_arg_reductions(op, attrs, rng, single_node, ort_check):
    x = rng.integers(0, 3, (3, 4, 5)).astype(F32)  # ties on purpose
    ort_check(single_node(op, {"x": x}, [("y", np.int64)], attrs, opset=13), {"x": x})


@pytest.mark.parametrize("attrs", [{}, {"exclusive": 1}, {"reverse": 1}, {"exclusive": 1, "reverse": 1}])
@pytest.mark.parametrize("axis", [0, -1])
def test_cumsum(attrs, axis, rng, single_node, ort_check):
    x = rng.standard_normal((3, 5)).astype(F32)
    model = single_node("CumSum", {"x": x}, [("y", F32)], attrs, {"axis": np.array(axis, np.int64)}, opset=14)
    ort_check(model, {"x": x})


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("axis,keepdims", [(-1, 0), (-1, 1), (1, 0), (2, 1)])
def test_reductions_over_a_short_axis(op, axis, keepdims, rng, single_node, ort_check):
    """An STFT's (re, im) pair, a 3-wide channel axis: folded slice by slice (kernels/reduce.py)."""
    x = (rng.random((3, 2, 4, 2)) + 0.5).astype(F32)
    inits = {"axes": np.array([axis], np.int64)}
    ort_check(single_node(op, {"x": x}, [("y", F32)], {"keepdims": keepdims}, inits, opset=18), {"x": x})


@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min", "prod", "l1", "l2", "sumsquare"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_short_axis_fold_gives_numpys_bits(kind, dtype, rng):
    from infc.compiler.runtime.kernels.reduce import _REDUCERS, SHORT_AXIS, _fold_short_axis

    for size in range(1, SHORT_AXIS + 1):
        x = (rng.standard_normal((5, size, 7, size)) * 20).astype(dtype)
        if x.dtype.kind == "f":
            x[0, 0, 3, 0] = np.nan  # NaN wins the folds of max and min as it wins NumPy's
        for axis in (1, 3):
            for keepdims in (False, True):
                want = np.asarray(_REDUCERS[kind](x, (axis,), keepdims)).astype(x.dtype, copy=False)
                got = np.asarray(_fold_short_axis(kind, x, axis, keepdims)).astype(x.dtype, copy=False)
                assert got.shape == want.shape
                np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("attrs", [{}, {"exclusive": 1}, {"reverse": 1}])
def test_float16_cumsum_accumulates_in_float32(attrs, rng, single_node, ort_check):
    """A long float16 CumSum (a flattened image): added one float16 step at a time, the running sum's
    rounding grew to 2% of it by 384 steps (fuzz_graphs); onnxruntime stays within float16's rounding."""
    x = rng.random((2, 512)).astype(np.float16)
    model = single_node("CumSum", {"x": x}, [("y", np.float16)], attrs, {"axis": np.array(-1, np.int64)}, opset=14)
    ort_check(model, {"x": x})
