"""Loops shared with the helper thread (gemm_impls.parallel_for) and the GEMMs split over it."""

import threading

import numpy as np
import pytest

from infc.compiler.runtime import gemm_impls
from infc.compiler.runtime.gemm_impls import parallel_for, product_into

F32 = np.float32


def test_every_item_runs_once_and_errors_reach_the_caller():
    seen = []
    lock = threading.Lock()

    def item(i):
        with lock:
            seen.append(i)

    parallel_for(50, item)
    assert sorted(seen) == list(range(50))

    def failing(i):
        if i == 7:
            raise ValueError("item 7")

    with pytest.raises(ValueError, match="item 7"):
        parallel_for(20, failing)
    parallel_for(3, item)  # still usable afterwards


def test_nested_loops_run_inline():
    out = np.zeros((4, 4))

    def row(i):
        def cell(j):
            out[i, j] = i * 4 + j
        parallel_for(4, cell)

    parallel_for(4, row)
    np.testing.assert_array_equal(out.ravel(), np.arange(16))


def test_small_loops_stay_on_the_caller():
    threads = set()
    parallel_for(8, lambda i: threads.add(threading.get_ident()), nbytes=1024)
    assert threads == {threading.get_ident()}


@pytest.mark.parametrize("m,k,n", [(512, 64, 256), (64, 256, 1024), (8, 16, 8)])  # row blocks, column blocks, tiny
def test_split_gemms_match_one_call(m, k, n, rng, monkeypatch):
    monkeypatch.setattr(gemm_impls, "SPLIT_MIN_MACS", 1 << 16)
    a, b = rng.standard_normal((m, k)).astype(F32), rng.standard_normal((k, n)).astype(F32)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(product_into(a, b), expected, rtol=1e-4, atol=1e-4)
    out = np.full((m, 2 * n), np.nan, F32)[:, :n]  # a strided destination, as the conv blocks use
    product_into(a, b.T.copy().T, out=out)  # a transposed (column-major) weight
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
