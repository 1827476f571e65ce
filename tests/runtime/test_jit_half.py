"""The compiled float16 / bfloat16 conversions (kernels/jit_half.py) give NumPy's and ml_dtypes' bits:
every float16 pattern widened, float32 patterns over the whole bit space narrowed and rounded, the
edges (ties, the overflow midpoint, subnormals, signed zeros, inf, NaN) included."""

import ml_dtypes
import numpy as np
import pytest

from infc.compiler.runtime import jit
from infc.compiler.runtime.kernels import jit_half
from infc.compiler.runtime.kernels.cast import cast_array, round_to
from infc.compiler.runtime.kernels.common import KernelContext

EDGES = np.array([0.0, -0.0, 65504, 65519.996, 65520, -65520, 65536, 3.0e38, 2.0**-14, -(2.0**-14), 2.0**-24,
                  2.0**-25, 2.0**-25 * 1.0000001, 3 * 2.0**-25, -3 * 2.0**-25, 1e-45, -1e-45, 6.0975e-05,
                  1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, -(1.0 + 2.0**-11), np.inf, -np.inf, np.nan, -np.nan],
                 dtype=np.float32)


def _samples() -> np.ndarray:
    rng = np.random.default_rng(0)
    any_bits = rng.integers(0, 2**32, size=400_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    in_range = (rng.standard_normal(200_000) * np.exp(rng.uniform(-20, 12, 200_000))).astype(np.float32)
    return np.concatenate([any_bits, in_range, EDGES])


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit, NaN for NaN (payloads may differ)."""
    width = np.uint16 if a.dtype.itemsize == 2 else np.uint32
    both_nan = np.isnan(a.astype(np.float32)) & np.isnan(b.astype(np.float32))
    return a.dtype == b.dtype and bool(np.all((a.view(width) == b.view(width)) | both_nan))


def test_float32_to_float16_is_numpys_conversion():
    x = _samples()
    assert _same_bits(jit_half.float32_to_float16(x), x.astype(np.float16))
    assert jit_half._to_float16(x) is not None or not jit.enabled()  # the compiled path ran


def test_every_float16_pattern_widens_as_numpy_does():
    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    assert _same_bits(jit_half.float16_to_float32(every), every.astype(np.float32))


@pytest.mark.parametrize("low", ["float16", "bfloat16"])
def test_rounding_to_the_low_type_is_the_two_casts(low):
    x = _samples()
    want = x.astype(getattr(ml_dtypes, low) if low == "bfloat16" else np.float16).astype(np.float32)
    assert _same_bits(jit_half.round_to_low(x, low), want)
    in_place = x.copy()
    assert jit_half.round_to_low(in_place, low, out=in_place) is in_place and _same_bits(in_place, want)


def test_strided_and_tiny_inputs_take_the_same_values():
    x = _samples()[:4096].reshape(64, 64)
    strided, tiny = x[:, ::3], x[:1, :5]
    for part in (strided, tiny):
        assert _same_bits(jit_half.round_to_low(part, "float16"), part.astype(np.float16).astype(np.float32))
        assert _same_bits(jit_half.float32_to_float16(part), part.astype(np.float16))


def test_the_numpy_paths_agree():
    x = _samples()[:10_000]
    with jit.disabled():
        assert _same_bits(cast_array(x, np.dtype(np.float16)), x.astype(np.float16))
        assert _same_bits(jit_half.round_to_low(x, "float16"), x.astype(np.float16).astype(np.float32))


def test_the_round_to_kernel_writes_into_a_donated_buffer():
    x = _samples()[:1000]
    donated = x.copy()
    (y,) = round_to([donated], {"to": 10}, KernelContext(17, [donated]))
    assert y is donated and _same_bits(y, x.astype(np.float16).astype(np.float32))
    # not float32 (a float64 value cast down): the two casts, the second to float32 as in the pair the
    # executor folded (a float64 result made every op after it float64: fuzz_graphs --forms edge seed 2118)
    (z,) = round_to([x.astype(np.float64)], {"to": 16}, KernelContext(17, [None]))
    assert z.dtype == np.float32
