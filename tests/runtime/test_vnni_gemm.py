"""VNNI register tiles for integer decode rows (runtime/vnni_gemm.py): exact int32 sums of uint8
activation codes times int8 weight codes, every row count and ragged K / N, or None where the CPU
or compiled kernels cannot run them."""

import numpy as np
import pytest

from infc.compiler.runtime import jit
from infc.compiler.runtime.vnni_gemm import PANEL, has_vnni, pack_vnni, vnni_product

needs_vnni = pytest.mark.skipif(not (has_vnni() and jit.enabled()), reason="no AVX512-VNNI, or compiled kernels are off")


def test_the_packing_puts_four_k_of_a_column_side_by_side():
    codes = np.arange(5 * 70).reshape(5, 70).astype(np.int8)
    panels = pack_vnni(codes)
    assert panels.shape == (2, 2, PANEL * 4)
    v, c, j, g, p = 1, 3, 2, 0, 0  # vector 1, column 3 of it, k = 4g + j
    assert panels[p, g, (v * 16 + c) * 4 + j] == codes[4 * g + j, p * PANEL + v * 16 + c]
    assert panels[1, 1, 5 * 4 + 1] == 0 and panels[1, 0, 6 * 4] == 0  # past K (k = 5), past N (column 70)


@needs_vnni
@pytest.mark.parametrize("k, n", [(576, 1536), (67, 70), (5, 3), (1100, 129)])
@pytest.mark.parametrize("rows", [1, 2, 6, 7, 13])
def test_the_tiles_give_the_exact_sums(k, n, rows):
    rng = np.random.default_rng(k + n + rows)
    codes = rng.integers(-128, 128, (k, n)).astype(np.int8)
    codes[:, :2] = 127  # the largest products
    a = rng.integers(0, 256, (rows, k)).astype(np.uint8)
    a[0] = 255
    got = vnni_product(a, pack_vnni(codes), n)
    np.testing.assert_array_equal(got, a.astype(np.int64) @ codes.astype(np.int64))


def test_no_tiles_without_compiled_kernels():
    codes = np.ones((8, 8), np.int8)
    with jit.disabled():
        assert vnni_product(np.ones((1, 8), np.uint8), pack_vnni(codes), 8) is None
