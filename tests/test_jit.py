"""compiler/runtime/jit.py: compiled kernels are optional and switch off cleanly."""

import numpy as np
import pytest

from infc.compiler.runtime import jit


@jit.jit
def _row_sums(x, out):
    for i in range(x.shape[0]):
        total = 0.0
        for j in range(x.shape[1]):
            total += x[i, j]
        out[i] = total


def test_compiled_kernel_matches_numpy_and_keeps_nan():
    if not jit.enabled():
        pytest.skip("numba is not installed")
    x = np.random.default_rng(0).standard_normal((7, 33)).astype(np.float32)
    x[3, 5] = np.nan
    out = np.empty(7, np.float32)
    _row_sums.get()(x, out)
    expected = x.sum(axis=1)
    assert np.isnan(out[3]) and np.isnan(expected[3])
    keep = ~np.isnan(expected)
    np.testing.assert_allclose(out[keep], expected[keep], rtol=1e-5)


def test_disabled_block_turns_kernels_off_and_restores():
    before = _row_sums.get()
    with jit.disabled():
        assert _row_sums.get() is None
        assert not jit.enabled()
    assert (_row_sums.get() is None) == (before is None)


def test_row_result_does_not_depend_on_row_count():
    """Decoder plans rely on batch invariance: a row's result is the same alone or among many."""
    if not jit.enabled():
        pytest.skip("numba is not installed")
    x = np.random.default_rng(1).standard_normal((64, 577)).astype(np.float32)
    many = np.empty(64, np.float32)
    _row_sums.get()(x, many)
    for count in (1, 2, 5):
        few = np.empty(count, np.float32)
        _row_sums.get()(np.ascontiguousarray(x[:count]), few)
        assert np.array_equal(few, many[:count])
