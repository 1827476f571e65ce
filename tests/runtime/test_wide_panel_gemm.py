"""The wide register tiles (runtime/panel_gemm.py: sixteen-lane vectors across panels of 64 columns,
what decode rows run on where the CPU has 512-bit vectors) and the "delta" codes (code minus zero
point as int8): their sums equal the chain kernels' bit for bit, for any row count, column tail,
scale group and cut of K, so a decoder's logits keep their bits and stay batch invariant. They
compute the same on any CPU (LLVM splits the wide vectors where it must), so these run everywhere."""

import numpy as np
import pytest

from infc.compiler.runtime import chain_gemm, invariant_gemm, jit
from infc.compiler.runtime.kernels import batch_invariant as step
from infc.compiler.runtime.kernels.common import KernelContext
from infc.compiler.runtime.kernels.quant import dequantize_linear
from infc.compiler.runtime.code_chain_gemm import codes_product
from infc.compiler.runtime.panel_gemm import (WIDE_PANEL, code_panel_product, pack_code_panels, pack_delta_panels,
                                              pack_panels, panel_product)
from infc.compiler.testing import random_block_codes

needs_jit = pytest.mark.skipif(not jit.enabled(), reason="compiled kernels are off or numba is missing")
CUTS = (None, 32, 5)  # the own order's cut of K, then cuts inside and across scale groups
ROWS = ((0, 1), (3, 2), (7, 4), (1, 6), (4, 7), (2, 8), (5, 10), (0, 12), (9, 13))  # 7-12: half tiles


def _edges(k: int, depth: int | None) -> np.ndarray:
    return invariant_gemm.own_edges(k) if depth is None else np.asarray(chain_gemm.k_blocks(k, depth, 1), np.int64)


@needs_jit
@pytest.mark.parametrize("k, n", [(576, 200), (100, 37), (61, 129), (1000, 64)])
def test_wide_float_panels_sum_as_the_chain_kernel(k, n):
    rng = np.random.default_rng(k + n)
    w = rng.standard_normal((k, n)).astype(np.float32)
    panels = pack_panels(w, WIDE_PANEL)
    assert panels.shape == (-(-n // WIDE_PANEL), k, WIDE_PANEL)
    x = rng.standard_normal((24, k)).astype(np.float32)
    for depth in CUTS:
        edges = _edges(k, depth)
        want = chain_gemm.chain_product(x, w, edges, ((0, n),), np.empty((24, n), np.float32))
        assert np.array_equal(panel_product(x, panels, n, edges), want)
        for start, m in ROWS:  # batch invariance: a row's bits whatever rows are beside it
            assert np.array_equal(panel_product(x[start:start + m], panels, n, edges), want[start:start + m])


def _codes(rng, k, n, group, dtype):
    """Codes whose deltas fit in int8: symmetric int8 (zero points 0, as quantize_dynamic writes
    them) or 4-bit values in uint8 with 4-bit zero points (matmul_nbits_quantizer's)."""
    codes, scale, zero = random_block_codes(rng, k, n, group, dtype, uint8_high=16)
    if dtype == np.int8:
        zero[:] = 0
    return codes, scale, zero


@needs_jit
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("k, n, group", [(576, 200, 32), (100, 37, 16), (61, 129, 7), (576, 64, 576)])
def test_wide_code_and_delta_panels_sum_as_the_codes_chain_kernel(dtype, k, n, group):
    rng = np.random.default_rng(k + n + group)
    codes, scale, zero = _codes(rng, k, n, group, dtype)
    wide, deltas = pack_code_panels(codes, scale, zero, WIDE_PANEL), pack_delta_panels(codes, scale, zero, group, WIDE_PANEL)
    assert deltas is not None and deltas[0].dtype == np.int8 and deltas[2].shape[1] == 0
    x = rng.standard_normal((24, k)).astype(np.float32)
    for depth in CUTS:
        edges = _edges(k, depth)
        want = codes_product(x, codes, scale, zero, group, edges, ((0, n),))
        for packed in (wide, deltas):
            assert np.array_equal(code_panel_product(x, packed, n, group, edges), want)
            for start, m in ROWS:
                assert np.array_equal(code_panel_product(x[start:start + m], packed, n, group, edges), want[start:start + m])
    weight = dequantize_linear([codes, scale, zero], {"axis": 0, "block_size": group}, None)[0]
    np.testing.assert_allclose(want, x.astype(np.float64) @ weight.astype(np.float64), rtol=1e-4, atol=1e-4)


def test_deltas_that_do_not_fit_in_int8_are_declined():
    codes = np.array([[255, 0], [3, 4]], np.uint8)
    zero = np.array([[0, 200]], np.uint8)
    assert pack_delta_panels(codes, np.ones((1, 2), np.float32), zero, 2) is None
    zero[:] = 100  # 255 - 100 = 155 still does not fit; 0 - 100 would
    assert pack_delta_panels(codes, np.ones((1, 2), np.float32), zero, 2) is None
    zero[:] = 128
    assert pack_delta_panels(codes, np.ones((1, 2), np.float32), zero, 2) is not None


@needs_jit
@pytest.mark.parametrize("dtype, fits", [(np.int8, True), (np.uint8, True), (np.uint8, False)])
def test_decode_rows_of_a_blas_served_code_step_run_on_wide_delta_panels(monkeypatch, dtype, fits):
    """Where the BLAS recipe serves the float32 rows (min_rows found), decode rows of a code step ran
    on the codes chain loop; on a CPU with 512-bit vectors they now run on wide delta panels (wide
    code panels where the deltas do not fit in int8), with the bits of the float32 path (the chain
    kernel's reproduction of the BLAS's rows) and of any batch."""
    monkeypatch.setattr(invariant_gemm, "_MIN_ROWS", {})
    monkeypatch.setattr(invariant_gemm, "_CHAIN_EDGES", {})
    monkeypatch.setattr(step, "has_wide_vectors", lambda: True)
    rng = np.random.default_rng(11)
    k, n, group = 576, 960, 32
    codes, scale, zero = _codes(rng, k, n, group, dtype) if fits else random_block_codes(rng, k, n, group, dtype)
    weight = dequantize_linear([codes, scale, zero], {"axis": 0, "block_size": group}, None)[0]
    if invariant_gemm.min_rows(weight) is None or invariant_gemm._CHAIN_EDGES[(weight.shape, weight.strides)] is None:
        pytest.skip("this BLAS has no row-invariant recipe with a chain cut (the own order serves every row)")
    plain = {"inner_op": "MatMul", "inner_domain": "", "const_inputs": [1]}
    coded = {**plain, "weight_group": group}
    x = rng.standard_normal((1, 8, k)).astype(np.float32)
    ctx = KernelContext(17)
    (batch,) = step.batch_invariant([x, weight, codes, scale, zero], coded, ctx)
    packed = ctx.memo["code_panels"][1]
    assert packed[0].shape[2] == WIDE_PANEL and (packed[2].shape[1] == 0) == fits  # wide (delta) panels, packed once
    assert np.array_equal(batch, step.batch_invariant([x, weight], plain, KernelContext(17))[0])
    for m in (1, 2, 5):
        (rows,) = step.batch_invariant([x[:, :m], weight, codes, scale, zero], coded, ctx)
        assert np.array_equal(rows, batch[:, :m]), m


@needs_jit
def test_decode_rows_of_a_blas_served_float32_step_run_on_wide_panels(monkeypatch):
    """Float32 decode rows ran on the chain kernel (weight rows strided across the matrix); on a CPU
    with 512-bit vectors they run on the weight packed in wide panels, with the chain kernel's cut of
    K: the bits of the BLAS recipe's rows, of any batch; prefill rows stay on the BLAS."""
    monkeypatch.setattr(invariant_gemm, "_MIN_ROWS", {})
    monkeypatch.setattr(invariant_gemm, "_CHAIN_EDGES", {})
    rng = np.random.default_rng(12)
    k, n = 576, 1000
    w = rng.standard_normal((k, n)).astype(np.float32)
    rows_from = invariant_gemm.min_rows(w)
    if rows_from is None or invariant_gemm._CHAIN_EDGES[(w.shape, w.strides)] is None:
        pytest.skip("this BLAS has no row-invariant recipe with a chain cut (the own order serves every row)")
    attrs = {"inner_op": "MatMul", "inner_domain": "", "const_inputs": [1]}
    x = rng.standard_normal((1, 64, k)).astype(np.float32)
    monkeypatch.setattr(step, "has_wide_vectors", lambda: False)
    before = [step.batch_invariant([x[:, :m], w], attrs, KernelContext(17))[0] for m in (1, 3, 8, 64)]
    monkeypatch.setattr(step, "has_wide_vectors", lambda: True)
    ctx = KernelContext(17)
    for m, want in zip((1, 3, 8, 64), before):
        (got,) = step.batch_invariant([x[:, :m], w], attrs, ctx)
        assert np.array_equal(got, want), m
        assert np.array_equal(got[0], before[-1][0, :m]), m  # and the rows of a 64-row prefill
    assert ctx.memo["wide_panels"][1].shape == (-(-n // WIDE_PANEL), k, WIDE_PANEL)
