"""The register-blocked own-order kernel (runtime/panel_gemm.py): on packed weight panels it computes
the chain kernel's own-order sums bit for bit, for any row count, tail of rows or columns, cut of K
and split between cores, so decoder rows stay independent of the batch; without compiled kernels it
declines."""

import numpy as np
import pytest

from infc.compiler.runtime import chain_gemm, invariant_gemm, jit, panel_gemm

needs_jit = pytest.mark.skipif(not jit.enabled(), reason="compiled kernels are off or numba is missing")


def test_panels_hold_the_weight_by_column_groups_zero_padded(rng):
    w = rng.standard_normal((5, 37)).astype(np.float32)
    panels = panel_gemm.pack_panels(w)
    assert panels.shape == (3, 5, panel_gemm.PANEL) and panels.flags.c_contiguous
    assert np.array_equal(panels[1], w[:, 16:32])
    assert np.array_equal(panels[2, :, :5], w[:, 32:]) and not panels[2, :, 5:].any()


def _own_order_on_the_chain_kernel(a, w):
    edges = invariant_gemm.own_edges(w.shape[0])
    out = np.empty((len(a), w.shape[1]), np.float32)
    return chain_gemm.chain_product(np.ascontiguousarray(a), w, edges, ((0, w.shape[1]),), out)


@needs_jit
@pytest.mark.parametrize("k, n", [(1000, 37), (576, 192), (64, 16), (1536, 200), (7, 5)])
def test_panel_sums_are_the_chain_kernels_bit_for_bit(k, n, rng):
    w = rng.standard_normal((k, n)).astype(np.float32)
    panels = panel_gemm.pack_panels(w)
    edges = invariant_gemm.own_edges(k)
    assert len(edges) > 2 or k < 900  # K = 1000 and 1536 cross blocks
    x = rng.standard_normal((70, k)).astype(np.float32)
    full = panel_gemm.panel_product(x, panels, n, edges)
    assert np.array_equal(full, _own_order_on_the_chain_kernel(x, w))
    np.testing.assert_allclose(full, x.astype(np.float64) @ w.astype(np.float64), rtol=1e-4, atol=1e-4)
    for start, m in ((0, 1), (3, 2), (11, 5), (20, 6), (1, 7), (30, 13), (5, 64)):
        part = panel_gemm.panel_product(x[start:start + m], panels, n, edges)
        assert np.array_equal(part, full[start:start + m]), f"{m} rows from {start}"


@needs_jit
def test_splitting_the_panels_between_cores_changes_no_bit(rng, monkeypatch):
    w = rng.standard_normal((300, 520)).astype(np.float32)
    panels, edges = panel_gemm.pack_panels(w), invariant_gemm.own_edges(300)
    x = rng.standard_normal((9, 300)).astype(np.float32)
    assert len(panel_gemm.panel_blocks(len(panels), 9 * 300 * 520)) == 2
    split = panel_gemm.panel_product(x, panels, 520, edges)
    monkeypatch.setattr(panel_gemm, "SPLIT_MIN_MACS", 1 << 40)
    assert len(panel_gemm.panel_blocks(len(panels), 9 * 300 * 520)) == 1
    assert np.array_equal(panel_gemm.panel_product(x, panels, 520, edges), split)


def test_without_compiled_kernels_the_panel_kernel_declines(rng):
    w = rng.standard_normal((8, 8)).astype(np.float32)
    with jit.disabled():
        assert panel_gemm.panel_product(np.ones((2, 8), np.float32), panel_gemm.pack_panels(w), 8,
                                        invariant_gemm.own_edges(8)) is None
