"""Prefill rows of weight-only quantized plans in infc's own order (runtime/panel_gemm.py): the
register tiles rebuild each weight row from its codes, scales and zero points, int8 or uint8, and
their sums equal the codes chain kernel's (and so the dequantized weight's) bit for bit, for any
row count, column tail, scale group and cut of K, split between cores or not."""

import numpy as np
import pytest

from infc.compiler.runtime import chain_gemm, invariant_gemm, jit, panel_gemm
from infc.compiler.testing import random_block_codes
from infc.compiler.runtime.code_chain_gemm import codes_product
from infc.compiler.runtime.panel_gemm import code_panel_product, pack_code_panels
from infc.compiler.runtime.kernels.batch_invariant import batch_invariant
from infc.compiler.runtime.kernels.common import KernelContext
from infc.compiler.runtime.kernels.quant import dequantize_linear

needs_jit = pytest.mark.skipif(not jit.enabled(), reason="compiled kernels are off or numba is missing")


@needs_jit
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("k, n, group", [(576, 200, 32), (100, 37, 16), (61, 33, 7), (1000, 16, 128)])
def test_code_panels_sum_as_the_codes_chain_kernel(dtype, k, n, group):
    rng = np.random.default_rng(k + n + group)
    codes, scale, zero = random_block_codes(rng, k, n, group, dtype)
    packed = pack_code_panels(codes, scale, zero)
    x = rng.standard_normal((40, k)).astype(np.float32)
    for edges in (invariant_gemm.own_edges(k), np.asarray(chain_gemm.k_blocks(k, 32, 1), np.int64),
                  np.asarray(chain_gemm.k_blocks(k, 5, 1), np.int64)):  # cuts inside and across scale groups
        want = codes_product(x, codes, scale, zero, group, edges, ((0, n),))
        got = code_panel_product(x, packed, n, group, edges)
        assert np.array_equal(got, want)
        for start, m in ((0, 1), (3, 5), (7, 6), (1, 13), (9, 31)):
            assert np.array_equal(code_panel_product(x[start:start + m], packed, n, group, edges), want[start:start + m])
    weight = dequantize_linear([codes, scale, zero], {"axis": 0, "block_size": group}, None)[0]
    np.testing.assert_allclose(got, x.astype(np.float64) @ weight.astype(np.float64), rtol=1e-4, atol=1e-4)


@needs_jit
def test_splitting_code_panels_between_cores_changes_no_bit(monkeypatch):
    rng = np.random.default_rng(5)
    codes, scale, zero = random_block_codes(rng, 300, 520, 16, np.int8)
    packed, edges = pack_code_panels(codes, scale, zero), invariant_gemm.own_edges(300)
    x = rng.standard_normal((12, 300)).astype(np.float32)
    split = code_panel_product(x, packed, 520, 16, edges)
    monkeypatch.setattr(panel_gemm, "SPLIT_MIN_MACS", 1 << 40)
    assert np.array_equal(code_panel_product(x, packed, 520, 16, edges), split)


@needs_jit
def test_the_op_takes_prefill_rows_from_code_panels_where_the_blas_has_no_recipe(monkeypatch):
    rng = np.random.default_rng(6)
    k, n, group = 576, 96, 32
    codes, scale, zero = random_block_codes(rng, k, n, group, np.uint8)
    weight = dequantize_linear([codes, scale, zero], {"axis": 0, "block_size": group}, None)[0]
    monkeypatch.setitem(invariant_gemm._MIN_ROWS, (weight.shape, weight.strides), None)
    coded = {"inner_op": "MatMul", "inner_domain": "", "const_inputs": [1], "weight_group": group}
    x = rng.standard_normal((1, 30, k)).astype(np.float32)
    ctx = KernelContext(17)
    (y,) = batch_invariant([x, weight, codes, scale, zero], coded, ctx)
    assert ctx.memo["code_panels"][0] is codes  # packed once, from the codes
    assert np.array_equal(y[0], codes_product(x[0], codes, scale, zero, group, invariant_gemm.own_edges(k), ((0, n),)))
    (row,) = batch_invariant([x[:, 4:5], weight, codes, scale, zero], coded, KernelContext(17))  # a decode row
    assert np.array_equal(row[0, 0], y[0, 4])


def test_without_compiled_kernels_the_code_panels_decline():
    codes, scale, zero = random_block_codes(np.random.default_rng(7), 64, 32, 16, np.int8)
    with jit.disabled():
        assert code_panel_product(np.ones((9, 64), np.float32), pack_code_panels(codes, scale, zero), 32, 16,
                                  invariant_gemm.own_edges(64)) is None
