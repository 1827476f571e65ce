"""Integer GEMMs of few rows on AVX512-VNNI: uint8 activation codes times int8 weight codes, exact
int32 sums (decode rows of row-quantized steps, runtime/row_quantized_gemm.py).

Why: onnxruntime's MatMulInteger has no GEMV; at one row it packs the row and runs its GEMM kernel,
about 5 GB/s of int8 weights on a Sapphire Rapids core pair, so a decode step of SmolLM2's
quantize_dynamic file spent most of its time there. Decode rows are bound by the weight's bytes:
this kernel streams each 8-bit weight once per call, `vpdpbusd` adding four uint8 x int8 products
into each int32 lane, a register tile of up to ROW_TILE rows x PANEL columns (6 x 4 accumulators, 4
weight vectors, one broadcast: 29 of AVX-512's 32 registers), written as LLVM IR through a numba
intrinsic as runtime/panel_gemm.py's tiles are. Integer sums are exact, so these are the same
numbers as onnxruntime's: the step's rows may take either.

The weight is packed once into panels of PANEL columns, each k-quad's 4 x PANEL bytes column-major
within 16-column vectors ([panels, ceil(K / 4), 4 vectors x 16 columns x 4 k]), K and N zero-padded.
"""

from __future__ import annotations

import functools

import numpy as np

from .chain_gemm import over_column_blocks
from .jit import jit, prange
from .panel_gemm import _host_features, panel_blocks, row_switch

LANES = 16  # int32 lanes of a 512-bit vector
VECTORS = 4
PANEL = LANES * VECTORS  # weight columns per panel
QUAD = 4  # k values one vpdpbusd lane adds
ROW_TILE = 6
MAX_ROWS = 16  # the rows it serves (decode steps); more go to onnxruntime's GEMM


def has_vnni() -> bool:
    """The CPU numba compiles for has AVX512-VNNI (vpdpbusd on 512-bit vectors)."""
    features = _host_features()
    return bool(features.get("avx512vnni") and features.get("avx512f") and features.get("avx512bw"))


def pack_vnni(codes: np.ndarray) -> np.ndarray:
    """int8 codes [K, N] as [ceil(N / PANEL), ceil(K / 4), PANEL * 4]: in panel p, k-quad g, byte
    (v * LANES + c) * 4 + j is codes[4g + j, p * PANEL + v * LANES + c] (0 past K and N)."""
    k, n = codes.shape
    quads, panels = -(-k // QUAD), -(-n // PANEL)
    padded = np.zeros((quads * QUAD, panels * PANEL), np.int8)
    padded[:k, :n] = codes
    return np.ascontiguousarray(padded.reshape(quads, QUAD, panels, PANEL).transpose(2, 0, 3, 1)).reshape(
        panels, quads, PANEL * QUAD)


def _tile_codegen(rows: int):
    """The IR of tile(a, i0, w, out, o0, j0, quads): for r < rows and c < PANEL,
    out[o0 + r, j0 + c] = sum over k < 4 * quads of a[i0 + r, k] * W[k, c], a uint8 [M, >= 4 quads]
    and w one packed panel int8 [quads, PANEL * 4], out int32 (all C-contiguous rows)."""
    from llvmlite import ir  # noqa: PLC0415 - numba's own dependency: only when compiled kernels are on
    from numba.core import cgutils  # noqa: PLC0415

    i8, i32 = ir.IntType(8), ir.IntType(32)
    vector = ir.VectorType(i32, LANES)
    splat = ir.Constant(ir.VectorType(i32, LANES), [0] * LANES)

    def element(builder, data, byte_offset, typ):
        raw = builder.gep(builder.bitcast(data, i8.as_pointer()), [byte_offset])
        return builder.bitcast(raw, typ.as_pointer())

    def codegen(context, builder, signature, args):
        a_val, i0, w_val, out_val, o0, j0, quads = args
        a, w, out = (context.make_array(signature.args[i])(context, builder, v) for i, v in ((0, a_val), (2, w_val), (3, out_val)))
        dot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vector, [vector] * 3),
                                             "llvm.x86.avx512.vpdpbusd.512")
        intp = i0.type
        a_row, w_row, out_row = (builder.extract_value(x.strides, 0) for x in (a, w, out))
        accumulators = [[cgutils.alloca_once_value(builder, ir.Constant(vector, [0] * LANES)) for _ in range(VECTORS)]
                        for _ in range(rows)]
        a_rows = [builder.mul(builder.add(i0, ir.Constant(intp, r)), a_row) for r in range(rows)]
        with cgutils.for_range(builder, quads) as loop:
            g = loop.index
            w_at = builder.mul(g, w_row)
            weights = [builder.load(element(builder, w.data, builder.add(w_at, ir.Constant(intp, v * LANES * QUAD)), vector),
                                    align=1) for v in range(VECTORS)]
            quad_at = builder.mul(g, ir.Constant(intp, QUAD))
            for r in range(rows):
                four = builder.load(element(builder, a.data, builder.add(a_rows[r], quad_at), i32), align=1)
                broadcast = builder.shuffle_vector(builder.insert_element(ir.Constant(vector, ir.Undefined), four,
                                                                          ir.Constant(i32, 0)),
                                                   ir.Constant(vector, ir.Undefined), splat)
                for v in range(VECTORS):
                    builder.store(builder.call(dot, [builder.load(accumulators[r][v]), broadcast, weights[v]]),
                                  accumulators[r][v])
        for r in range(rows):
            row_at = builder.mul(builder.add(o0, ir.Constant(intp, r)), out_row)
            for v in range(VECTORS):
                column = builder.mul(builder.add(j0, ir.Constant(intp, v * LANES)), ir.Constant(intp, 4))
                builder.store(builder.load(accumulators[r][v]), element(builder, out.data, builder.add(row_at, column), vector),
                              align=4)
        return context.get_dummy_value()

    return codegen


@functools.cache
def _tiles() -> dict:
    from numba import types  # noqa: PLC0415
    from numba.extending import intrinsic  # noqa: PLC0415

    codegen = row_switch({rows: _tile_codegen(rows) for rows in range(1, ROW_TILE + 1)})

    def vnni_tile(typingctx, count, a, i0, w, out, o0, j0, quads):
        index = types.intp
        return types.void(index, a, index, w, out, index, index, index), codegen

    return {"vnni_tile": intrinsic(vnni_tile)}


@jit(intrinsics=_tiles)
def _columns(a, panels, quads, p0, p1, out):
    """out[:, p0*PANEL : p1*PANEL] = a @ W's panels p0..p1-1."""
    rows = a.shape[0]
    for p in range(p0, p1):
        w = panels[p]
        i0 = 0
        while i0 < rows:
            count = min(ROW_TILE, rows - i0)
            vnni_tile(count, a, i0, w, out, i0, p * PANEL, quads)  # noqa: F821 - bound by `intrinsics`
            i0 += count


@jit(calls=(_columns,))
def _blocks(a, panels, quads, blocks, out):
    for i in prange(blocks.shape[0]):
        _columns(a, panels, quads, blocks[i, 0], blocks[i, 1], out)


def vnni_product(codes: np.ndarray, panels: np.ndarray, n: int) -> np.ndarray | None:
    """codes [M, K] uint8 @ W (pack_vnni's panels of int8 codes), exact, as int32 [M, n]; None when
    compiled kernels are off or the CPU has no VNNI."""
    kernel = _columns.get() if has_vnni() else None
    if kernel is None:
        return None
    quads = panels.shape[1]
    a = np.zeros((codes.shape[0], quads * QUAD), np.uint8)
    a[:, :codes.shape[1]] = codes
    out = np.empty((codes.shape[0], panels.shape[0] * PANEL), np.int32)
    count = panels.shape[0]
    over_column_blocks(panel_blocks(count, a.size * n), count, lambda p0, p1: kernel(a, panels, quads, p0, p1, out), _blocks,
                       lambda spread, array: spread(a, panels, quads, array, out))
    return out[:, :n]
