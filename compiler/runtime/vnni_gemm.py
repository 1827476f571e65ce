"""Integer GEMMs of few rows on AVX512-VNNI: uint8 activation codes times int8 weight codes, exact
int32 sums (decode rows of row-quantized steps, runtime/row_quantized_gemm.py).

Why: onnxruntime's MatMulInteger has no GEMV; at one row it packs the row and runs its GEMM kernel,
about 5 GB/s of int8 weights on a Sapphire Rapids core pair, so a decode step of SmolLM2's
quantize_dynamic file spent most of its time there. Decode rows are bound by the weight's bytes:
this kernel streams each 8-bit weight once per call, `vpdpbusd` adding four uint8 x int8 products
into each int32 lane, a register tile of up to ROW_TILE rows x PANEL columns (6 x 4 accumulators, 4
weight vectors, one broadcast: 29 of AVX-512's 32 registers; runtime/dot_tiles.py, the form it
shares with the AVX512-BF16 tiles). Integer sums are exact, so these are the same
numbers as onnxruntime's: the step's rows may take either.

The weight is packed once into panels of PANEL columns, each k-quad's 4 x PANEL bytes column-major
within 16-column vectors ([panels, ceil(K / 4), 4 vectors x 16 columns x 4 k]), K and N zero-padded.
"""

from __future__ import annotations

import functools

import numpy as np

from . import cpu_features
from .chain_gemm import over_column_blocks
from .dot_tiles import PANEL, ROW_TILE, word_dot_tiles
from .jit import jit, prange
from .panel_gemm import panel_blocks

QUAD = 4  # k values one vpdpbusd lane adds
MAX_ROWS = 16  # the rows it serves (decode steps); more go to onnxruntime's GEMM


def has_vnni() -> bool:
    """The CPU numba compiles for has AVX512-VNNI (vpdpbusd on 512-bit vectors)."""
    return cpu_features.has("avx512vnni", "avx512f", "avx512bw")


def pack_vnni(codes: np.ndarray) -> np.ndarray:
    """int8 codes [K, N] as [ceil(N / PANEL), ceil(K / 4), PANEL * 4]: in panel p, k-quad g, byte
    (v * LANES + c) * 4 + j is codes[4g + j, p * PANEL + v * LANES + c] (0 past K and N)."""
    k, n = codes.shape
    quads, panels = -(-k // QUAD), -(-n // PANEL)
    padded = np.zeros((quads * QUAD, panels * PANEL), np.int8)
    padded[:k, :n] = codes
    return np.ascontiguousarray(padded.reshape(quads, QUAD, panels, PANEL).transpose(2, 0, 3, 1)).reshape(
        panels, quads, PANEL * QUAD)


def _declare(module, sums, words):
    from numba.core import cgutils  # noqa: PLC0415
    from llvmlite import ir  # noqa: PLC0415

    return cgutils.get_or_insert_function(module, ir.FunctionType(sums, [sums, words, words]), "llvm.x86.avx512.vpdpbusd.512")


@functools.cache
def _tiles() -> dict:
    return {"vnni_tile": word_dot_tiles("vnni_tiles", _declare, float_sums=False)}


@jit(intrinsics=_tiles)
def _columns(a, panels, p0, p1, out):
    """out[:, p0*PANEL : p1*PANEL] = a @ W's panels p0..p1-1."""
    rows = a.shape[0]
    for p in range(p0, p1):
        w = panels[p]
        i0 = 0
        while i0 < rows:
            count = min(ROW_TILE, rows - i0)
            vnni_tile(count, a, i0, w, out, i0, p * PANEL)  # noqa: F821 - bound by `intrinsics`
            i0 += count


@jit(calls=(_columns,))
def _blocks(a, panels, blocks, out):
    for i in prange(blocks.shape[0]):
        _columns(a, panels, blocks[i, 0], blocks[i, 1], out)


def vnni_product(codes: np.ndarray, panels: np.ndarray, n: int) -> np.ndarray | None:
    """codes [M, K] uint8 @ W (pack_vnni's panels of int8 codes), exact, as int32 [M, n]; None when
    compiled kernels are off or the CPU has no VNNI."""
    kernel = _columns.get() if has_vnni() else None
    if kernel is None:
        return None
    quads = panels.shape[1]
    a = codes if codes.shape[1] == quads * QUAD and codes.flags.c_contiguous else None
    if a is None:  # K not a multiple of four: the tiles read whole quads, zero past K
        a = np.zeros((codes.shape[0], quads * QUAD), np.uint8)
        a[:, :codes.shape[1]] = codes
    out = np.empty((codes.shape[0], panels.shape[0] * PANEL), np.int32)
    count = panels.shape[0]
    over_column_blocks(panel_blocks(count, a.size * n), count, lambda p0, p1: kernel(a, panels, p0, p1, out), _blocks,
                       lambda spread, array: spread(a, panels, array, out))
    return out[:, :n]
