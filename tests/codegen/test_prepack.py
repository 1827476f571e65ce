"""Prepack orders against a model of how the skinny kernel's lanes read them (templates/skinny.cuh),
written from the mma.m16n8k16 A-fragment layout with the kernel's slot -> k choice: register r of
k16 half s in lane (g, t) holds row g + 8 (r % 2) and k = 8 t + 4 s + 2 (r // 2) + (0, 1)."""

from __future__ import annotations

import numpy as np
import pytest

from infc.compiler.codegen import prepack
from infc.compiler.codegen.reference import gemm_reference, relative_error


def read_as_kernel(packed: np.ndarray, N: int, K: int, nw: int, kind: str) -> np.ndarray:
    """Rebuilds W (padded) from the packed bytes the way skinny.cuh consumes them."""
    step = prepack.SKINNY_K_STEP
    n_pad, k_pad = -(-N // (16 * nw)) * 16 * nw, -(-K // step) * step
    loads = 1 if kind == "int8" else 2          # 16-byte loads per lane, step and n16 tile
    lanes = packed.reshape(-1, 16)              # one row per lane load, in memory order
    w = np.full((n_pad, k_pad), -1, dtype=np.int64)
    index = 0
    for group in range(n_pad // (16 * nw)):
        for kb in range(k_pad // step):
            for j in range(nw):
                for v in range(loads):
                    for lane in range(32):
                        g, t = lane // 4, lane % 4
                        data = lanes[index]
                        index += 1
                        for s in range(2):
                            for r in range(4):
                                for e in range(2):
                                    if kind == "int8":   # word 2 s + r // 2; bytes 0, 2 (r even) or 1, 3
                                        value = data[4 * (2 * s + r // 2) + 2 * e + r % 2]
                                    elif v == s:         # load s, word r
                                        value = data.view(np.uint16)[2 * r + e]
                                    else:
                                        continue
                                    n = group * 16 * nw + 16 * j + g + 8 * (r % 2)
                                    k = kb * step + 8 * t + 4 * s + 2 * (r // 2) + e
                                    assert w[n, k] == -1, "an element is packed twice"
                                    w[n, k] = value
    assert index == lanes.shape[0] and (w >= 0).all()
    return w


@pytest.mark.parametrize("kind", ["bfloat16", "float16", "int8"])
@pytest.mark.parametrize("N,K,nw", [(16, 64, 2), (40, 100, 4), (8, 130, 1)])
def test_pack_skinny_matches_kernel_read_order(kind, N, K, nw):
    rng = np.random.default_rng(N * K)
    w = rng.standard_normal((N, K), dtype=np.float32)
    if kind == "int8":
        w, _ = prepack.quantize_int8(w)
    packed = prepack.pack_skinny(w, nw, kind)
    assert packed.dtype == np.uint8 and packed.size % 16 == 0
    read = read_as_kernel(packed, N, K, nw, kind)
    if kind == "int8":
        assert (read[:N, :K] - 128 == w).all() and (read[N:] == 128).all() and (read[:, K:] == 128).all()
    else:
        assert (read[:N, :K] == prepack.to_bits(w, kind)).all()
        assert (read[N:] == 0).all() and (read[:, K:] == 0).all()


def test_pack_skinny_rejects_unquantized_int8():
    with pytest.raises(ValueError, match="quantize first"):
        prepack.pack_skinny(np.ones((8, 64), np.float32), 1, "int8")


def test_bf16_rounding_is_nearest_even():
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5, 3.0e-39, 65504.0], dtype=np.float32)
    bits = prepack.float_to_bf16_bits(x)
    # 1 + 2^-8 is a tie: rounds to even (1.0); 1 + 3 * 2^-8 rounds up to 1 + 2^-6
    assert bits.tolist()[:3] == [0x3F80, 0x3F80, 0x3F82]
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert (bits == x.astype(ml_dtypes.bfloat16).view(np.uint16)).all()
    assert (prepack.bf16_bits_to_float(bits) == x.astype(ml_dtypes.bfloat16).astype(np.float32)).all()


def test_interleave_gate_up_keeps_swiglu():
    rng = np.random.default_rng(1)
    a, w, bias = rng.standard_normal((3, 8)), rng.standard_normal((6, 8)), rng.standard_normal(6)
    wi, bi = prepack.interleave_gate_up(w, bias)
    y = a @ wi.T + bi                                   # what the kernel computes before its epilogue
    out = y[:, 0::2] / (1 + np.exp(-y[:, 0::2])) * y[:, 1::2]
    assert relative_error(out, gemm_reference(a, w, bias=bias, swiglu=True)) < 1e-12
    with pytest.raises(ValueError, match="even"):
        prepack.interleave_gate_up(w[:5])


def test_quantize_int8_per_channel():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((5, 64)).astype(np.float32) * np.arange(1, 6, dtype=np.float32)[:, None]
    w[2] = 0.0
    q, scale = prepack.quantize_int8(w)
    assert q.dtype == np.int8 and scale.dtype == np.float32 and np.abs(q).max() <= 127
    assert scale[2] == 1.0 and (q[2] == 0).all()
    assert np.abs(q * scale[:, None] - w).max() <= scale.max() / 2 + 1e-6
