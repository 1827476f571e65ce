"""Float32 GEMMs for decoder plans (runtime/invariant_gemm.py, kernels/batch_invariant.py): a row's
result is bit-identical whatever the number of rows, on this machine's real BLAS, for weight shapes
on both sides of OpenBLAS's GEMV and small-matrix thresholds; the threshold search finds a
simulated BLAS's regime change exactly; a shape without a recipe runs on the chain kernel in its own
order, or in float64 without compiled kernels."""

import numpy as np
import pytest

from infc.compiler.runtime import invariant_gemm, jit, panel_gemm
from infc.compiler.runtime.kernels import kernel_for
from infc.compiler.runtime.kernels.common import KernelContext

ROW_COUNTS = (1, 2, 3, 5, 7, 9, 12, 16, 17, 33, 64, 101, 150, 257, 400, 520)
SHAPES = [(576, 192), (576, 576), (200, 1536), (96, 200), (32, 100), (64, 7), (7, 64), (1, 1)]


@pytest.fixture(autouse=True)
def fresh_probes(monkeypatch):
    monkeypatch.setattr(invariant_gemm, "_MIN_ROWS", {})


def _blas_recipe_exists() -> bool:
    """This BLAS keeps rows invariant from some row count (not OpenBLAS's Haswell kernels, whose
    rows change with M at any size: OPENBLAS_CORETYPE=Haswell)."""
    w = np.random.default_rng(0).standard_normal((96, 200)).astype(np.float32)
    return invariant_gemm._probe(w)[0] is not None


needs_blas_recipe = pytest.mark.skipif(not _blas_recipe_exists(), reason="this BLAS has no row-invariant recipe")


@pytest.mark.parametrize("k, n", SHAPES)
def test_rows_are_bit_identical_whatever_the_row_count(k, n, rng):
    w = rng.standard_normal((k, n)).astype(np.float32)
    rows_from = invariant_gemm.min_rows(w)
    if rows_from is None:  # the chain kernel in its own order serves every row count
        assert not _blas_recipe_exists()
        if not jit.enabled():
            pytest.skip("no BLAS recipe and no compiled kernels: float64 serves")

        def product(rows):
            return invariant_gemm.own_order_product(rows, w)
    else:
        assert 1 <= rows_from <= invariant_gemm.reference_rows(k, n)

        def product(rows):
            return invariant_gemm.row_invariant_product(rows, w, rows_from)
    x = rng.standard_normal((ROW_COUNTS[-1], k)).astype(np.float32)
    full = product(x)
    assert full.dtype == np.float32 and full.shape == (len(x), n)
    np.testing.assert_allclose(full, x.astype(np.float64) @ w.astype(np.float64), rtol=1e-4, atol=1e-4)
    for m in ROW_COUNTS:
        start = (m * 7) % (len(x) - m + 1)  # rows from the middle: the position in the batch changes too
        part = product(x[start:start + m])
        assert np.array_equal(part, full[start:start + m]), f"{m} rows from {start} differ from the full product"


def test_a_strided_weight_is_probed_apart_from_a_contiguous_one(rng):
    w = rng.standard_normal((120, 80)).astype(np.float32)
    transposed = np.ascontiguousarray(w.T).T  # same shape, column-major: another BLAS path
    invariant_gemm.min_rows(w)
    invariant_gemm.min_rows(transposed)
    assert len(invariant_gemm._MIN_ROWS) == 2


@needs_blas_recipe
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


@needs_blas_recipe
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


def test_a_shape_the_probe_rejected_runs_in_the_chain_kernels_own_order(rng, monkeypatch):
    """No BLAS recipe (OPENBLAS_CORETYPE=Haswell): every row count on the chain kernel with a fixed
    cut of K, row-invariant by construction; without compiled kernels, float64."""
    run = kernel_for("infc", "BatchInvariant")
    w = rng.standard_normal((900, 64)).astype(np.float32)
    monkeypatch.setitem(invariant_gemm._MIN_ROWS, (w.shape, w.strides), None)
    a = rng.standard_normal((40, 900)).astype(np.float32)
    attrs = {"inner_op": "MatMul", "inner_domain": "", "const_inputs": [1]}
    want = (a.astype(np.float64) @ w.astype(np.float64)).astype(np.float32)
    if jit.enabled():
        ctx = KernelContext(17)
        (full,) = run([a, w], attrs, ctx)
        np.testing.assert_allclose(full, want, rtol=1e-4, atol=1e-4)
        assert 1 not in ctx.memo  # no float64 weight: the float32 own-order kernel ran, on panels
        assert np.array_equal(ctx.memo["own"][1], panel_gemm.pack_panels(w))
        assert np.array_equal(full, invariant_gemm.own_order_product(a, w))  # the chain kernel's sums
        assert ctx.memo["own"][0] is w  # later calls go straight to the panels, with the same bits
        (again,) = run([a[:7], w], attrs, ctx)
        assert np.array_equal(again, full[:7])
        for start, m in ((0, 1), (5, 3), (9, 8), (3, 17), (0, 33)):
            (part,) = run([a[start:start + m], w], attrs, KernelContext(17))
            assert np.array_equal(part, full[start:start + m]), f"{m} rows from {start}"
    with jit.disabled():
        ctx = KernelContext(17)
        (y,) = run([a[:9], w], attrs, ctx)
        np.testing.assert_allclose(y, want[:9], rtol=1e-6, atol=1e-6)
        assert ctx.memo[1][1].dtype == np.float64  # float64_op cast the weight


def test_stacks_of_single_rows_by_their_own_matrices_run_in_float32():
    """A mixture of experts exported as batched MMs: [S, 1, K] token rows by [S, K, N] expert weights
    gathered per token. Each stack entry is one fixed-shape product, so float32 is batch-invariant as
    it is (it ran in float64 before: 17x slower on gpt-oss's prefill): a token's row comes out the
    same bits alone and among 37 others, and as float32 matmul computes it."""
    rng = np.random.default_rng(0)
    rows, weights = (rng.standard_normal((37, 1, 96)).astype(np.float32),
                     rng.standard_normal((37, 96, 160)).astype(np.float32))
    step = kernel_for("infc", "BatchInvariant")
    attrs = {"inner_op": "MatMul", "inner_domain": "", "const_inputs": []}
    (all_rows,) = step([rows, weights], attrs, KernelContext(17))
    assert all_rows.dtype == np.float32 and np.array_equal(all_rows, np.matmul(rows, weights))
    for i in (0, 5, 36):
        (alone,) = step([rows[i:i + 1], weights[i:i + 1]], attrs, KernelContext(17))
        assert np.array_equal(alone[0], all_rows[i])
    (broadcast,) = step([rows[:, :, :96], weights[:1]], attrs, KernelContext(17))  # one shared matrix: not this form
    np.testing.assert_allclose(broadcast, np.matmul(rows, weights[:1]), rtol=1e-5, atol=1e-5)
