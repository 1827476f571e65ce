"""Decode rows of weight-only quantized plans read 8-bit codes (runtime/code_chain_gemm.py): each
weight rebuilt as the plan's DequantizeLinear step rebuilds it, summed in the chain kernel's order,
so the rows equal the chain kernel's and the BLAS recipe's on the dequantized weight bit for bit."""

import numpy as np
import pytest

from infc.compiler.runtime import chain_gemm, invariant_gemm, jit
from infc.compiler.testing import random_block_codes
from infc.compiler.runtime.code_chain_gemm import codes_product
from infc.compiler.runtime.kernels.batch_invariant import batch_invariant
from infc.compiler.runtime.kernels.common import KernelContext
from infc.compiler.runtime.kernels.quant import dequantize_linear

needs_jit = pytest.mark.skipif(not jit.enabled(), reason="compiled kernels are off or numba is missing")


def _codes(rng, k, n, group, dtype):
    """Codes, scales, zero points (uint8: 4-bit values) and the weight the plan's DequantizeLinear rebuilds."""
    codes, scale, zero = random_block_codes(rng, k, n, group, dtype, uint8_high=16)
    weight = dequantize_linear([codes, scale, zero], {"axis": 0, "block_size": group}, None)[0]
    return codes, scale, zero, weight


@needs_jit
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("k, n, group", [(576, 1536, 32), (1536, 576, 16), (100, 70, 16), (61, 33, 7)])
def test_code_rows_equal_the_chain_kernel_on_the_dequantized_weight(dtype, k, n, group):
    rng = np.random.default_rng(k + n)
    codes, scale, zero, weight = _codes(rng, k, n, group, dtype)
    blocks = invariant_gemm.column_blocks(k, n)
    for depth in (448, 32, 5):  # block edges inside and across scale groups
        edges = np.asarray(chain_gemm.k_blocks(k, depth, 1), np.int64)
        for m in (1, 2, 3, 8):
            a = rng.standard_normal((m, k)).astype(np.float32)
            expected = chain_gemm.chain_product(a, weight, edges, blocks, np.empty((m, n), np.float32))
            got = codes_product(a, codes, scale, zero, group, edges, blocks)
            assert np.array_equal(got, expected), (depth, m, np.abs(got - expected).max())


@needs_jit
def test_the_op_gives_the_same_rows_from_codes_as_from_the_weight(monkeypatch):
    monkeypatch.setattr(invariant_gemm, "_MIN_ROWS", {})
    monkeypatch.setattr(invariant_gemm, "_CHAIN_EDGES", {})
    rng = np.random.default_rng(3)
    k, n, group = 576, 960, 16
    codes, scale, zero, weight = _codes(rng, k, n, group, np.int8)
    plain = {"inner_op": "MatMul", "inner_domain": "", "const_inputs": [1]}
    coded = {**plain, "weight_group": group}
    for m in (1, 4, 8, 9, 40, 130):  # decode rows read the codes; the BLAS serves the others
        x = rng.standard_normal((1, m, k)).astype(np.float32)
        from_codes = batch_invariant([x, weight, codes, scale, zero], coded, KernelContext(17))[0]
        from_weight = batch_invariant([x, weight], plain, KernelContext(17))[0]
        assert np.array_equal(from_codes, from_weight), m
    # the decode rows did come from the codes: other codes, other rows
    other = codes.copy()
    other[0] ^= 1
    x = rng.standard_normal((1, 1, k)).astype(np.float32)
    assert not np.array_equal(batch_invariant([x, weight, other, scale, zero], coded, KernelContext(17))[0],
                              batch_invariant([x, weight], plain, KernelContext(17))[0])
    # batch invariance across the two paths: a row alone (codes) equals it among 130 (BLAS)
    x = rng.standard_normal((1, 130, k)).astype(np.float32)
    many = batch_invariant([x, weight, codes, scale, zero], coded, KernelContext(17))[0]
    one = batch_invariant([x[:, 7:8], weight, codes, scale, zero], coded, KernelContext(17))[0]
    assert np.array_equal(one[0, 0], many[0, 7])


def test_without_compiled_kernels_the_codes_are_not_read():
    rng = np.random.default_rng(4)
    codes, scale, zero, weight = _codes(rng, 64, 32, 16, np.uint8)
    edges = np.asarray(chain_gemm.k_blocks(64, 448, 1), np.int64)
    with jit.disabled():
        assert codes_product(np.ones((1, 64), np.float32), codes, scale, zero, 16, edges, ((0, 32),)) is None
        attrs = {"inner_op": "MatMul", "inner_domain": "", "const_inputs": [1], "weight_group": 16}
        x = rng.standard_normal((1, 2, 64)).astype(np.float32)
        y = batch_invariant([x, weight, codes, scale, zero], attrs, KernelContext(17))[0]
    assert np.allclose(y, x @ weight, rtol=1e-5, atol=1e-5)
