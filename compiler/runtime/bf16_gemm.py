"""bf16 GEMM on AVX512-BF16: y = a @ w from bf16 values, products summed in float32 (`vdpbf16ps`).

Why: a bf16 plan (`--precision bf16`) rounds every GEMM's activation and weight to bf16 and sums
their products in float32 (build_precision.py). NumPy has no bf16 GEMM, so those GEMMs ran as fp32
sgemm on the rounded values, and the plan's extra rounding steps made it slower than the fp32 plan.
`vdpbf16ps` multiplies 32 bf16 pairs and adds each pair of products into one of 16 float32 lanes
per instruction: twice the products of a float32 FMA for the same register width, half the bytes
of weight and activation to move. A product of two bf16 values is exact in float32 (8 + 8 bits of
mantissa), so the kernel computes the program's sums up to the order of the float32 additions
(each output's K products in pairs, in k order), what any BLAS also reorders.

Layout. The weight [K, N] is packed once (the plan stores it): panels of PANEL = 64 columns, each
[ceil(K / 2), 64] 32-bit words, word (kp, j) holding bf16(w[2 kp, j]) in its low half and
bf16(w[2 kp + 1, j]) in its high half (a zero past K or N): one 512-bit load is 16 columns' pair of
k. The activation is rounded to bf16 pairs the same way per call ([M, ceil(K / 2)] words, the
round-to-nearest-even of kernels/jit_half.py; a no-op on values a bf16 program already rounded).
A register tile of up to ROWS = 6 rows x 64 columns (24 zmm accumulators, 4 weight vectors, one
broadcast of a row's pair: 29 of 32 registers) runs over all of K, written as LLVM IR through a
numba intrinsic (panel_gemm.py shows why numba needs that for register tiles).

The instruction only exists on CPUs with AVX512-BF16 (Cooper Lake, Sapphire Rapids, Zen 4 and
later): `bf16_product` returns None elsewhere (and when compiled kernels are off, or `disabled()`),
before anything is compiled, so a plan that picked this kernel still loads and runs there, through
its caller's float32 path (gemm_impls.matmul_bf16). Rows never depend on M: each output's sum is
the same whatever the tile or the split between cores.
"""

from __future__ import annotations

import functools

import numpy as np

from . import aligned, cpu_features
from .dot_tiles import PANEL, ROW_TILE as ROWS, word_dot_tiles  # the tiles: 6 rows x 4 vectors of 16 lanes
from .jit import IN_ORDER, jit, switched_off

SPLIT_MIN_MACS = 1 << 21  # products from this many multiply-adds split their panels with the helper thread
_OFF = [False]


def has_avx512_bf16() -> bool:
    """The CPU numba compiles for has vdpbf16ps on 512-bit vectors (and the kernel is not turned off)."""
    return not _OFF[0] and cpu_features.has("avx512bf16", "avx512f")


def disabled():
    """Within the block the kernel reports no AVX512-BF16, as on a CPU without it (tests of the fallback)."""
    return switched_off(_OFF)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 x as its bf16 bit patterns (uint16), rounded to nearest even, NaN kept quiet."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


TILE_PAIRS = 16  # k pairs are padded to a multiple of this: an AMX tile row (amx_gemm.py) reads 16


def bf16_values(x: np.ndarray) -> np.ndarray:
    """float32 x rounded to the nearest bf16 values, as float32."""
    return (bf16_bits(x).astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(np.shape(x))


def is_bf16_valued(x: np.ndarray) -> bool:
    """Every value of float32 x is a bf16 value (its low 16 bits are zero)."""
    x = np.asarray(x)
    return x.dtype == np.float32 and not (np.ascontiguousarray(x).view(np.uint32) & np.uint32(0xFFFF)).any()


def pack_pairs(w: np.ndarray) -> np.ndarray:
    """w [K, N] float32 as [ceil(N / PANEL), P, PANEL] uint32 words of bf16 k pairs (see the
    docstring), P = ceil(K / 2) rounded up to a multiple of TILE_PAIRS (zeros past K)."""
    k, n = w.shape
    pairs, count = -(-k // (2 * TILE_PAIRS)) * TILE_PAIRS, -(-n // PANEL)
    bits = np.zeros((2 * pairs, count * PANEL), np.uint16)
    bits[:k, :n] = bf16_bits(w)
    words = bits[0::2].astype(np.uint32) | (bits[1::2].astype(np.uint32) << 16)  # [pairs, count * PANEL]
    return aligned.copy(words.reshape(pairs, count, PANEL).transpose(1, 0, 2))  # tile rows on whole cache lines


@jit(fastmath=set())
def bf16_of(u):
    """bf16 bits of float32 bits u (uint32): nearest, ties to even; a NaN stays a (quiet) NaN.
    Written so every step stays a uint32 (the NaN choice made before the shift): the form that
    selected after shifting widened the loops' lanes to 64 bits and ran at half the speed."""
    odd = (u >> np.uint32(16)) & np.uint32(1)
    rounded = np.uint32(u + np.uint32(0x7FFF) + odd)
    rounded = (u | np.uint32(0x400000)) if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000) else rounded
    return rounded >> np.uint32(16)


@jit(fastmath=set(), calls=(bf16_of,))
def _activation_pairs(a, out):
    """out[m, kp] = bf16(a[m, 2 kp]) | bf16(a[m, 2 kp + 1]) << 16, zero past a's rows and columns
    (`a` float32 viewed as uint32; out may have more rows and pairs than `a` needs)."""
    rows, k = a.shape
    whole = k // 2
    for m in range(out.shape[0]):
        if m >= rows:
            for kp in range(out.shape[1]):
                out[m, kp] = 0
            continue
        for kp in range(whole):  # branch-free: vectorized
            out[m, kp] = bf16_of(a[m, 2 * kp]) | (bf16_of(a[m, 2 * kp + 1]) << np.uint32(16))
        for kp in range(whole, out.shape[1]):
            out[m, kp] = bf16_of(a[m, 2 * kp]) if 2 * kp < k else np.uint32(0)


@jit(fastmath=set(), calls=(bf16_of,))
def _even_pairs(a, out):
    """_activation_pairs for an even K, `a` viewed as uint64 pairs (little-endian: k even in the low half)."""
    rows, whole = a.shape
    for m in range(out.shape[0]):
        if m >= rows:
            for kp in range(out.shape[1]):
                out[m, kp] = 0
            continue
        for kp in range(whole):  # contiguous 64-bit loads: vectorized
            u = a[m, kp]
            out[m, kp] = bf16_of(np.uint32(u & np.uint64(0xFFFFFFFF))) | (
                bf16_of(np.uint32(u >> np.uint64(32))) << np.uint32(16))
        for kp in range(whole, out.shape[1]):
            out[m, kp] = 0


def activation_pairs(a: np.ndarray, rows: int, pairs: int) -> np.ndarray | None:
    """a [M, K] float32 as [rows, pairs] words of bf16 k pairs (rows >= M, pairs >= ceil(K / 2); zeros
    past a), or None when compiled kernels are off."""
    a = np.ascontiguousarray(a, np.float32)
    is_even = a.shape[1] % 2 == 0 and a.size > 0
    convert = (_even_pairs if is_even else _activation_pairs).get()
    if convert is None:
        return None
    out = aligned.empty((rows, pairs), np.uint32)  # tile rows on whole cache lines
    convert(a.view(np.uint64) if is_even else a.view(np.uint32), out)
    return out


def _declare(module, sums, words):
    from llvmlite import ir  # noqa: PLC0415

    dot = module.globals.get("llvm.x86.avx512bf16.dpbf16ps.512")
    if dot is None:  # the pre-LLVM-17 signature (i32 words); LLVM's auto-upgrade bitcasts to bfloat
        dot = ir.Function(module, ir.FunctionType(sums, [sums, words, words]), name="llvm.x86.avx512bf16.dpbf16ps.512")
    return dot


@functools.cache
def tiles() -> dict:
    """`bf16_tile(count, a, i0, w, out, o0, j0)`: the register tile of `count` rows (runtime/dot_tiles.py)
    over pairs of bf16 words a [M, KP], w [KP, PANEL] uint32, out float32 (all of its PANEL columns written)."""
    return {"bf16_tile": word_dot_tiles("bf16_tiles", _declare, float_sums=True)}


@jit(fastmath=IN_ORDER, intrinsics=tiles)
def _tile(count, a, i0, w, target, o0, j0):
    bf16_tile(count, a, i0, w, target, o0, j0)  # noqa: F821 - bound by `intrinsics`


@jit(fastmath=IN_ORDER, calls=(_tile,))
def _panel_columns(a, panels, p0, p1, n, out):
    """out[:, p0*PANEL : p1*PANEL] (cut at n) = a @ W from W's panels p0..p1-1."""
    rows = a.shape[0]
    scratch = np.empty((ROWS, PANEL), np.float32)  # the last panel's columns past n land here
    for p in range(p0, p1):
        w = panels[p]
        j0 = p * PANEL
        width = min(PANEL, n - j0)
        i0 = 0
        while i0 < rows:
            count = min(ROWS, rows - i0)
            if width == PANEL:
                _tile(count, a, i0, w, out, i0, j0)
            else:
                _tile(count, a, i0, w, scratch, 0, 0)
                for m in range(count):
                    for j in range(width):
                        out[i0 + m, j0 + j] = scratch[m, j]
            i0 += count


def bf16_product(a: np.ndarray, panels: np.ndarray, n: int, out: np.ndarray | None = None,
                 split: bool = True) -> np.ndarray | None:
    """a [M, K] float32 @ W [K, n] from W's `pack_pairs`, a rounded to bf16, float32 sums; into
    `out` ([M, n] float32 with unit-stride rows) when given; `split`: the panels may be shared with
    the helper thread. None where the CPU has no AVX512-BF16 or compiled kernels are off: the
    caller computes in float32."""
    if not has_avx512_bf16():
        return None
    kernel = _panel_columns.get()
    m, k = a.shape
    if not 0 <= panels.shape[1] - -(-k // 2) < TILE_PAIRS:
        raise ValueError(f"bf16 gemm: activation has {k} columns, the packed weight {2 * panels.shape[1]} rows")
    pairs = activation_pairs(a, m, panels.shape[1])
    if kernel is None or pairs is None:
        return None
    if out is None:
        out = np.empty((m, n), np.float32)
    count = panels.shape[0]
    if not split or count < 2 or m * k * n < SPLIT_MIN_MACS:
        kernel(pairs, panels, 0, count, n, out)
        return out
    from .gemm_impls import parallel_for  # noqa: PLC0415 - gemm_impls imports this module

    half = count // 2
    parallel_for(2, lambda i: kernel(pairs, panels, 0 if i == 0 else half, half if i == 0 else count, n, out))
    return out
