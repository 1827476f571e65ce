"""Register tiles of 32-bit-word dot products on 512-bit vectors, as LLVM IR for numba intrinsics:
the shared form of the VNNI tiles (`vpdpbusd`: four uint8 x int8 products into an int32 lane,
runtime/vnni_gemm.py) and the AVX512-BF16 tiles (`vdpbf16ps`: two bf16 products into a float32
lane, runtime/bf16_gemm.py).

    tile(a, i0, w, out, o0, j0): for r < rows and c < PANEL,
        out[o0 + r, j0 + c] = dot over the words k < len(w) of a's word (i0 + r, k) with w's word (k, c)

a holds a row's words at 4-byte steps (uint8 quads, uint32 bf16 pairs), w is one packed panel
[words, PANEL 32-bit words] (16 columns a vector), out has 32-bit elements and unit column stride.
Each row's accumulators start at zero and run over the words in order, so an output never depends
on the tile's size or place. ROW_TILE rows x 4 vectors: 24 accumulators, 4 weight vectors and one
broadcast of 32 registers.
"""

from __future__ import annotations

LANES = 16  # 32-bit lanes of a 512-bit vector
VECTORS = 4  # vectors across a panel
PANEL = LANES * VECTORS  # columns per panel
ROW_TILE = 6


def word_dot_codegen(rows: int, declare, float_sums: bool):
    """The codegen of `rows` rows of the tile above; `declare(module, sums, words)` returns the dot
    instruction's function (sums <16 x float> or <16 x i32>, operands <16 x i32> words)."""
    from llvmlite import ir  # noqa: PLC0415 - numba's own dependency: only when compiled kernels are on
    from numba.core import cgutils  # noqa: PLC0415

    i32 = ir.IntType(32)
    words = ir.VectorType(i32, LANES)
    sums = ir.VectorType(ir.FloatType(), LANES) if float_sums else words
    zero = ir.Constant(sums, [0.0 if float_sums else 0] * LANES)
    splat = ir.Constant(words, [0] * LANES)

    def element(builder, data, byte_offset, typ):
        raw = builder.gep(builder.bitcast(data, ir.IntType(8).as_pointer()), [byte_offset])
        return builder.bitcast(raw, typ.as_pointer())

    def codegen(context, builder, signature, args):
        a_val, i0, w_val, out_val, o0, j0 = args
        a, w, out = (context.make_array(signature.args[i])(context, builder, v) for i, v in ((0, a_val), (2, w_val), (3, out_val)))
        dot = declare(builder.module, sums, words)
        intp = i0.type
        step = ir.Constant(intp, 4)  # bytes a word
        a_row, w_row, out_row = (builder.extract_value(x.strides, 0) for x in (a, w, out))
        count = builder.extract_value(w.shape, 0)
        accumulators = [[cgutils.alloca_once_value(builder, zero) for _ in range(VECTORS)] for _ in range(rows)]
        a_rows = [builder.mul(builder.add(i0, ir.Constant(intp, r)), a_row) for r in range(rows)]
        with cgutils.for_range(builder, count) as loop:
            k = loop.index
            w_at = builder.mul(k, w_row)
            weights = [builder.load(element(builder, w.data, builder.add(w_at, ir.Constant(intp, v * LANES * 4)), words),
                                    align=4) for v in range(VECTORS)]
            k_at = builder.mul(k, step)
            for r in range(rows):
                word = builder.load(element(builder, a.data, builder.add(a_rows[r], k_at), i32), align=4)
                broadcast = builder.shuffle_vector(builder.insert_element(ir.Constant(words, ir.Undefined), word,
                                                                          ir.Constant(i32, 0)),
                                                   ir.Constant(words, ir.Undefined), splat)
                for v in range(VECTORS):
                    builder.store(builder.call(dot, [builder.load(accumulators[r][v]), broadcast, weights[v]]),
                                  accumulators[r][v])
        for r in range(rows):
            row_at = builder.mul(builder.add(o0, ir.Constant(intp, r)), out_row)
            for v in range(VECTORS):
                column = builder.mul(builder.add(j0, ir.Constant(intp, v * LANES)), step)
                builder.store(builder.load(accumulators[r][v]), element(builder, out.data, builder.add(row_at, column), sums),
                              align=4)
        return context.get_dummy_value()

    return codegen


def word_dot_tiles(name: str, declare, float_sums: bool):
    """A numba intrinsic tile(count, a, i0, w, out, o0, j0): the tile of `count` rows (1..ROW_TILE;
    one switch in the IR, panel_gemm.row_switch)."""
    from numba import types  # noqa: PLC0415
    from numba.extending import intrinsic  # noqa: PLC0415

    from .panel_gemm import row_switch  # noqa: PLC0415

    codegen = row_switch({rows: word_dot_codegen(rows, declare, float_sums) for rows in range(1, ROW_TILE + 1)})

    def typer(typingctx, count, a, i0, w, out, o0, j0):
        index = types.intp
        return types.void(index, a, index, w, out, index, index), codegen

    typer.__name__ = name
    return intrinsic(typer)
