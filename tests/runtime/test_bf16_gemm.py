"""The bf16 GEMM kernels (runtime/bf16_gemm.py: AVX512-BF16, runtime/amx_gemm.py: AMX-BF16) against
a float64 product of the bf16-rounded operands: the only difference allowed is the order of the
float32 additions. Odd M, N and K cover every tail (rows past a tile, columns past a panel, a K
pair and a tile step cut short)."""

from __future__ import annotations

import numpy as np
import pytest

from infc.compiler.runtime import amx_gemm, bf16_gemm, gemm_impls, jit

# (M, N, K): one value; tails of every kind; a row tile of six and an AMX block of 32 exactly plus one
SHAPES = [(1, 1, 1), (7, 70, 33), (13, 129, 64), (33, 65, 100), (6, 64, 2), (37, 200, 515)]
KERNELS = {"avx512": (bf16_gemm.bf16_product, bf16_gemm.has_avx512_bf16),
           "amx": (amx_gemm.amx_product, amx_gemm.has_amx_bf16)}
# float32 sums of K products in another order: a few ulps of the largest output, growing with sqrt(K)
RTOL = 2e-6


def _operands(m, n, k, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    return a, w


def _reference(a, w):
    return bf16_gemm.bf16_values(a).astype(np.float64) @ bf16_gemm.bf16_values(w).astype(np.float64)


def _error(y, reference):
    return float(np.abs(y - reference).max() / max(np.abs(reference).max(), 1e-30))


def _kernel(name):
    product, available = KERNELS[name]
    if not (available() and jit.enabled()):
        pytest.skip(f"this CPU has no usable {name} bf16 kernel (or compiled kernels are off)")
    return product


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_kernel_matches_float64_on_bf16_rounded_operands(name, m, n, k):
    product = _kernel(name)
    a, w = _operands(m, n, k)
    reference = _reference(a, w)
    out = np.full((m, n), np.nan, np.float32)  # every output written, none past n
    y = product(a, bf16_gemm.pack_pairs(w), n, out)
    assert y is out
    error = _error(y, reference)
    where = np.unravel_index(np.abs(y - reference).argmax(), y.shape)
    assert error <= RTOL, f"{name} {m}x{n}x{k}: max error {error:.2e} of the largest at {where}"


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_rows_do_not_depend_on_m_or_the_split(name):
    product = _kernel(name)
    a, w = _operands(70, 300, 260)
    packed = bf16_gemm.pack_pairs(w)
    whole = product(a, packed, 300, split=True)
    assert np.array_equal(whole, product(a, packed, 300, split=False))
    assert np.array_equal(whole[5:6], product(a[5:6], packed, 300))


def test_activation_rounding_is_casts_to_bfloat16():
    values = np.array([[np.nan, 1.0, np.inf, -np.inf, 3.3e38, 1e-40, -2.5, 1.00390625, 1.01171875]], np.float32)
    for width in (values.shape[1], values.shape[1] - 1):  # odd and even K: the two conversion loops
        x = values[:, :width]
        words = bf16_gemm.activation_pairs(x, 3, 16)
        if words is None:
            pytest.skip("compiled kernels are off")
        halves = np.stack([words & 0xFFFF, words >> 16], axis=-1).reshape(3, 32).astype(np.uint16)
        expected = np.zeros((3, 32), np.uint16)
        expected[0, :width] = bf16_gemm.bf16_bits(x)[0]
        assert np.array_equal(halves, expected)
    import ml_dtypes  # the reference bf16 rounding: ONNX Cast's

    finite = values[np.isfinite(values)]
    assert np.array_equal(bf16_gemm.bf16_values(finite), finite.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert bf16_gemm.is_bf16_valued(bf16_gemm.bf16_values(values)) and not bf16_gemm.is_bf16_valued(values)


@pytest.mark.parametrize("kernel", sorted(gemm_impls.BF16_KERNELS))
def test_without_the_instructions_the_impl_falls_back_to_float32(kernel):
    a, w = _operands(9, 80, 40)
    a, w = bf16_gemm.bf16_values(a), bf16_gemm.bf16_values(w)
    packed = {"w": w, "w_pairs": bf16_gemm.pack_pairs(w)}
    with bf16_gemm.disabled():  # as on a CPU without AVX512-BF16 / AMX: nothing compiled, nothing run
        assert not bf16_gemm.has_avx512_bf16() and not amx_gemm.has_amx_bf16()
        assert bf16_gemm.bf16_product(a, packed["w_pairs"], 80) is None
        assert amx_gemm.amx_product(a, packed["w_pairs"], 80) is None
        fallback = gemm_impls.matmul_bf16(a.reshape(1, 9, 40), packed, kernel=kernel)
    assert fallback.shape == (1, 9, 80)
    assert _error(fallback[0], _reference(a, w)) <= 1e-6
    native = gemm_impls.matmul_bf16(a, packed, kernel=kernel, threads=1)
    assert _error(native, fallback[0]) <= RTOL


def test_a_packed_weight_of_another_k_is_refused():
    a, w = _operands(4, 16, 64)
    if not bf16_gemm.has_avx512_bf16() or not jit.enabled():
        pytest.skip("no AVX512-BF16 here")
    with pytest.raises(ValueError, match="packed weight"):
        bf16_gemm.bf16_product(a[:, :20], bf16_gemm.pack_pairs(w), 16)


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("m,n,k", [(0, 16, 8), (4, 16, 0), (4, 0, 8)])
def test_empty_operands(name, m, n, k):
    product = _kernel(name)
    a, w = _operands(m, n, k)
    y = product(a, bf16_gemm.pack_pairs(w), n)
    assert y.shape == (m, n) and not y.any()
