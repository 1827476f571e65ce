"""Float32 GEMMs for decoder plans (runtime/invariant_gemm.py, kernels/batch_invariant.py): a row's
result is bit-identical whatever the number of rows, on this machine's real BLAS, for weight shapes
on both sides of OpenBLAS's GEMV and small-matrix thresholds; the threshold search finds a
simulated BLAS's regime change exactly; anything not verified runs in float64."""

import numpy as np
import pytest

from infc.compiler.runtime import invariant_gemm
from infc.compiler.runtime.kernels import kernel_for
from infc.compiler.runtime.kernels.common import KernelContext

ROW_COUNTS = (1, 2, 3, 5, 7, 9, 12, 16, 17, 33, 64, 101, 150, 257, 400, 520)
SHAPES = [(576, 192), (576, 576), (200, 1536), (96, 200), (32, 100), (64, 7), (7, 64), (1, 1)]


@pytest.fixture(autouse=True)
def fresh_probes(monkeypatch):
    monkeypatch.setattr(invariant_gemm, "_MIN_ROWS", {})


@pytest.mark.parametrize("k, n", SHAPES)
def test_rows_are_bit_identical_whatever_the_row_count(k, n, rng):
    w = rng.standard_normal((k, n)).astype(np.float32)
    rows_from = invariant_gemm.min_rows(w)
    assert rows_from is not None and 1 <= rows_from <= invariant_gemm.reference_rows(k, n)
    x = rng.standard_normal((ROW_COUNTS[-1], k)).astype(np.float32)
    full = invariant_gemm.row_invariant_product(x, w, rows_from)
    assert full.dtype == np.float32 and full.shape == (len(x), n)
    np.testing.assert_allclose(full, x.astype(np.float64) @ w.astype(np.float64), rtol=1e-4, atol=1e-4)
    for m in ROW_COUNTS:
        start = (m * 7) % (len(x) - m + 1)  # rows from the middle: the position in the batch changes too
        part = invariant_gemm.row_invariant_product(x[start:start + m], w, rows_from)
        assert np.array_equal(part, full[start:start + m]), f"{m} rows from {start} differ from the full product"


def test_a_strided_weight_is_probed_apart_from_a_contiguous_one(rng):
    w = rng.standard_normal((120, 80)).astype(np.float32)
    transposed = np.ascontiguousarray(w.T).T  # same shape, column-major: another BLAS path
    invariant_gemm.min_rows(w)
    invariant_gemm.min_rows(transposed)
    assert len(invariant_gemm._MIN_ROWS) == 2


@pytest.mark.parametrize("threshold", [1, 5, 16, 40, 333])
def test_the_probe_finds_where_a_simulated_small_matrix_path_ends(threshold, monkeypatch):
    """Below `threshold` rows the fake BLAS sums in float64 (other roundings), from it in float32."""
    def fake_product(a, w, out):
        if a.shape[0] < threshold:
            out[...] = (a.astype(np.float64) @ w.astype(np.float64)).astype(np.float32)
        else:
            np.matmul(a, w, out=out)
        return out

    monkeypatch.setattr(invariant_gemm, "_product", fake_product)
    w = np.random.default_rng(3).standard_normal((40, 30)).astype(np.float32)
    assert invariant_gemm.min_rows(w) == threshold


def test_a_threshold_too_costly_to_pad_to_means_float64(monkeypatch):
    def fake_product(a, w, out):  # never invariant below the reference
        out[...] = (a.astype(np.float64) @ w.astype(np.float64)).astype(np.float32)
        if a.shape[0] < invariant_gemm.REFERENCE_ROWS:
            out += np.float32(1e-3)
        return out

    monkeypatch.setattr(invariant_gemm, "_product", fake_product)
    big = np.zeros((1024, 1024), np.float32)  # reference 100 rows; padding 100 x 1M multiply-adds
    assert invariant_gemm.min_rows(big) is None


def test_the_op_runs_float32_by_the_recipe_and_float64_otherwise(rng):
    run = kernel_for("infc", "BatchInvariant")
    w = rng.standard_normal((96, 200)).astype(np.float32)
    a = rng.standard_normal((1, 37, 96)).astype(np.float32)
    attrs = {"inner_op": "MatMul", "inner_domain": "", "const_inputs": [1]}
    (full,) = run([a, w], attrs, KernelContext(17))
    (one,) = run([a[:, 5:6], w], attrs, KernelContext(17))
    assert full.shape == (1, 37, 200) and full.dtype == np.float32
    assert np.array_equal(full[:, 5:6], one)
    rows_from = invariant_gemm.min_rows(w)
    assert np.array_equal(full[0], invariant_gemm.row_invariant_product(a[0], w, rows_from))  # the float32 recipe

    bias = rng.standard_normal(200).astype(np.float32)
    gemm = {"inner_op": "Gemm", "inner_domain": "", "const_inputs": [1, 2], "transB": 1}
    ctx = KernelContext(17)
    (y,) = run([a[0], w.T.copy(), bias], gemm, ctx)
    np.testing.assert_allclose(y, a[0] @ w + bias, rtol=1e-4, atol=1e-5)
    assert ctx.memo[1][1].dtype == np.float64  # other inner ops: the float64 path, weight cast once
    (y7,) = run([a[0, 3:10], w.T.copy(), bias], gemm, ctx)
    assert np.array_equal(y7, y[3:10])


def test_a_shape_the_probe_rejected_runs_in_float64(rng, monkeypatch):
    run = kernel_for("infc", "BatchInvariant")
    w = rng.standard_normal((48, 64)).astype(np.float32)
    monkeypatch.setitem(invariant_gemm._MIN_ROWS, (w.shape, w.strides), None)
    a = rng.standard_normal((9, 48)).astype(np.float32)
    ctx = KernelContext(17)
    (y,) = run([a, w], {"inner_op": "MatMul", "inner_domain": "", "const_inputs": [1]}, ctx)
    want = (a.astype(np.float64) @ w.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
    assert ctx.memo[1][1].dtype == np.float64  # float64_op cast the weight
