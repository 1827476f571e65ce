"""The chain kernel's sums, register-blocked on packed weight panels (decoder GEMMs where the BLAS
has no row-invariant recipe; decode rows on CPUs with 512-bit vectors).

Why: where invariant_gemm finds no BLAS recipe whose rows are independent of M (OpenBLAS's Haswell
kernels, the ones AVX2 machines get), every row count of a decoder plan's GEMMs runs in one fixed
order of infc's own: per output element, K cut at fixed edges, each block one chain of fused
multiply-adds in k order from zero, the blocks added to the output in order. chain_gemm.py's loop
computes that with its accumulators in memory, at about half of what the BLAS reaches on prefill
rows (60-65 against 110-130 GFLOP/s on two cores), so prefill was 2x onnxruntime's there.

This kernel computes the same sums, bit for bit, the way GEMM libraries do: the weight packed once
into panels of PANEL columns ([panels, K, PANEL], k rows contiguous, the last panel zero-padded),
and a register tile of up to ROW_TILE rows x PANEL columns held in vector registers over a K block
(6 x 2 eight-lane accumulators, two weight vectors and one broadcast: 15 of AVX2's 16 registers).
numba does not keep such a tile in registers by itself (its arrays live in memory, and scalar
locals are not vectorized), so the tile is written as LLVM IR through a numba intrinsic: loads of
eight-lane vectors, a broadcast, and multiply-adds carrying the `contract` flag, exactly what the
chain kernel's `IN_ORDER` loop becomes (fused where the target has FMA, not reordered). Each output
element's chain is the same whatever the tile's size or place, so rows never depend on M.

Weight-only quantized plans (`--precision w8`, onnxruntime-genai int4 exports) hold W as 8-bit
codes with per-group scales and zero points. There, code_chain_gemm.py's loop, which rebuilds four
weight rows at a time in memory, did about 35 GFLOP/s on prefill rows (SmolLM2 w8 took twice
fp32's time to first token). `pack_code_panels` packs the codes, scales and zero points into the
same panels and the tile (`_tile_codegen` with `codes`) rebuilds each weight row in registers,
(code - zero) * scale in float32 as the plan's DequantizeLinear does, before the same multiply-adds:
the same bits as the codes chain kernel, without a float32 copy of the weight.

Wide tiles (WIDE_LANES x 4 vectors, panels of WIDE_PANEL = 64 columns; `pack_panels(w, WIDE_PANEL)`)
are the same loops on sixteen-lane vectors, for CPUs with AVX-512 (32 registers: 6 x 4 accumulators
fit). Numba's functions carry no "min-legal-vector-width", so LLVM lowers the explicit 512-bit
vectors to zmm registers though its own vectorizer prefers 256 bits on these cores. There they
serve decode rows even where a BLAS recipe serves the rest (kernels/batch_invariant.py, with the
chain kernel's cut of K, so the BLAS's bits): one row streams each panel in one run, and a code
weight is rebuilt at sixteen lanes an instruction (on a Sapphire Rapids core, SmolLM2's weights at
one row: float32 46 -> 40 ms, int8 codes 31 -> 23 ms, as deltas 19 ms). `pack_delta_panels` stores
code - zero as int8 where it fits (symmetric int8; 4-bit codes with 4-bit zero points): the tile's
"delta" kind skips the subtraction, the float of the difference being exactly the difference of
the floats. 7-12 rows of wide code panels run on half tiles (two vectors, up to 12 rows) so that
each weight is rebuilt once per pass rather than once per six rows.

`panel_product` and `code_panel_product` return None when compiled kernels are off; callers keep
the chain kernels or float64 (a process that turns them off midway mixes the two).
"""

from __future__ import annotations

import types

import numpy as np

from . import cpu_features
from .chain_gemm import over_column_blocks
from .jit import IN_ORDER, jit, prange

LANES = 8  # float32 lanes of a 256-bit vector
VECTORS = 2  # vectors across a panel
PANEL = LANES * VECTORS  # weight columns per panel
# where the CPU has 512-bit vectors (AVX-512: 32 registers), decode rows run wide tiles: four
# sixteen-lane vectors across a panel of 64 columns (6 rows: 24 accumulators, 4 weights, 1 broadcast).
# Twice the lanes per instruction: rebuilding 8-bit codes is what bounds a decode row there
WIDE_LANES = 16
WIDE_PANEL = 64
ROW_TILE = 6  # rows per register tile (see the docstring)
SPLIT_MIN_MACS = 1 << 17  # products from this many multiply-adds split their panels between two cores


def _panels_of(x: np.ndarray, width: int) -> np.ndarray:
    """x [rows, N] as [ceil(N / width), rows, width]: panel p holds columns p*width.., zero past N."""
    rows, n = x.shape
    count = -(-n // width)
    padded = np.zeros((rows, count * width), x.dtype)
    padded[:, :n] = x
    return np.ascontiguousarray(padded.reshape(rows, count, width).transpose(1, 0, 2))


def pack_panels(w: np.ndarray, width: int = PANEL) -> np.ndarray:
    """w [K, N] as [ceil(N / width), K, width] (width PANEL, or WIDE_PANEL for the wide tiles)."""
    return _panels_of(np.asarray(w, np.float32), width)


def pack_code_panels(codes: np.ndarray, scale: np.ndarray, zero: np.ndarray,
                     width: int = PANEL) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """codes [K, N], scale and zero [ceil(K / group), N] as panels [ceil(N / width), rows, width]
    each (past N: code 0, zero 0, scale 0, so a padded column's weight is 0)."""
    return (_panels_of(codes, width), _panels_of(np.asarray(scale, np.float32), width),
            _panels_of(zero.astype(codes.dtype), width))


def pack_delta_panels(codes: np.ndarray, scale: np.ndarray, zero: np.ndarray, group: int,
                      width: int = PANEL) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Like pack_code_panels, with each code minus its zero point as int8 (the tiles' "delta" kind:
    one subtraction less a weight) and zero points [panels, 0, width]; None when a difference does
    not fit in int8 (uint8 codes far from their zero point)."""
    deltas = codes.astype(np.int16) - np.repeat(zero.astype(np.int16), group, axis=0)[:codes.shape[0]]
    if deltas.size and (deltas.min() < -128 or deltas.max() > 127):
        return None
    count = -(-codes.shape[1] // width)
    return (_panels_of(deltas.astype(np.int8), width), _panels_of(np.asarray(scale, np.float32), width),
            np.zeros((count, 0, width), np.int8))


def panel_blocks(count: int, macs: int) -> tuple[tuple[int, int], ...]:
    """The ranges of panels the two cores take (each output column's sums are the same either way)."""
    if count < 2 or macs < SPLIT_MIN_MACS:
        return ((0, count),)
    return ((0, count // 2), (count // 2, count))


def _tile_codegen(rows: int, codes: str | None, lanes: int, vectors: int):
    """The IR of tile(a, i0, w, out, o0, j0, k0, k1): for r < rows and c < panel (lanes x vectors),
    out[o0 + r, j0 + c] += chain over k in [k0, k1) of a[i0 + r, k] * w[k, c], from zero.
    a, w and out are 2-D float32 arrays with unit column stride; w is one panel [K, panel].

    With `codes` ("int8" or "uint8"): tile(a, i0, c, s, z, group, out, o0, j0, k0, k1), the panel's
    weight given as codes c [K, panel], scales s and zero points z [ceil(K / group), panel] and
    rebuilt in registers as runtime/code_chain_gemm.py rebuilds it, (code - zero) * scale in float32
    (one rounding, never fused into the multiply-add), so the sums are the same bits. With "delta":
    c holds code - zero as int8 (z unread), whose float is exactly float(code) - float(zero), so the
    weight, and the sums, are the same bits for one subtraction less."""
    from llvmlite import ir  # noqa: PLC0415 - numba's own dependency: only when compiled kernels are on
    from numba.core import cgutils  # noqa: PLC0415

    panel = lanes * vectors
    f32 = ir.FloatType()
    vector = ir.VectorType(f32, lanes)
    wide = ir.VectorType(f32, panel)
    code_vector = ir.VectorType(ir.IntType(8), panel)
    lane0 = ir.Constant(ir.IntType(32), 0)
    splat = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)
    contract = ("contract",)  # the chain kernel's IN_ORDER: fuse the multiply-add, never reorder

    def element(builder, data, byte_offset, typ):
        raw = builder.gep(builder.bitcast(data, ir.IntType(8).as_pointer()), [byte_offset])
        return builder.bitcast(raw, typ.as_pointer())

    def floats(builder, data, byte_offset):
        """panel codes at the offset as vectors float vectors (exact: 8-bit integers)."""
        raw = builder.load(element(builder, data, byte_offset, code_vector), align=1)
        wide_codes = builder.uitofp(raw, wide) if codes == "uint8" else builder.sitofp(raw, wide)
        return [builder.shuffle_vector(wide_codes, ir.Constant(wide, ir.Undefined),
                                       ir.Constant(ir.VectorType(ir.IntType(32), lanes), list(range(v * lanes, (v + 1) * lanes))))
                for v in range(vectors)]

    def codegen(context, builder, signature, args):
        if codes:
            a_val, i0, c_val, s_val, z_val, group, out_val, o0, j0, k0, k1 = args
            a, c, sc, zp, out = (context.make_array(signature.args[i])(context, builder, v) for i, v in
                                 ((0, a_val), (2, c_val), (3, s_val), (4, z_val), (6, out_val)))
        else:
            a_val, i0, w_val, out_val, o0, j0, k0, k1 = args
            a, w, out = (context.make_array(signature.args[i])(context, builder, v)
                         for i, v in ((0, a_val), (2, w_val), (3, out_val)))
        intp = i0.type
        size = ir.Constant(intp, 4)
        a_row, out_row = (builder.extract_value(x.strides, 0) for x in (a, out))
        accumulators = [[cgutils.alloca_once_value(builder, ir.Constant(vector, [0.0] * lanes))
                         for _ in range(vectors)] for _ in range(rows)]
        a_rows = [builder.mul(builder.add(i0, ir.Constant(intp, r)), a_row) for r in range(rows)]

        def accumulate(k, weights):
            k_at = builder.mul(k, size)
            for r in range(rows):
                x = builder.load(element(builder, a.data, builder.add(a_rows[r], k_at), f32), align=4)
                broadcast = builder.shuffle_vector(builder.insert_element(ir.Constant(vector, ir.Undefined), x, lane0),
                                                   ir.Constant(vector, ir.Undefined), splat)
                for v in range(vectors):
                    product = builder.fmul(broadcast, weights[v], flags=contract)
                    total = builder.fadd(builder.load(accumulators[r][v]), product, flags=contract)
                    builder.store(total, accumulators[r][v])

        if codes:  # K in runs of one scale group: its scales and zero points loaded once per run
            c_row, s_row, z_row = (builder.extract_value(x.strides, 0) for x in (c, sc, zp))
            first = builder.sdiv(k0, group)
            runs = builder.add(builder.sub(builder.sdiv(builder.sub(k1, ir.Constant(intp, 1)), group), first),
                               ir.Constant(intp, 1))
            with cgutils.for_range(builder, runs) as run:
                g = builder.add(first, run.index)
                start = builder.mul(g, group)
                start = builder.select(builder.icmp_signed(">", k0, start), k0, start)
                stop = builder.mul(builder.add(g, ir.Constant(intp, 1)), group)
                stop = builder.select(builder.icmp_signed("<", k1, stop), k1, stop)
                scales = [builder.load(element(builder, sc.data, builder.add(builder.mul(g, s_row),
                                                                            ir.Constant(intp, v * lanes * 4)), vector),
                                       align=4) for v in range(vectors)]
                zeros = None if codes == "delta" else floats(builder, zp.data, builder.mul(g, z_row))
                with cgutils.for_range(builder, builder.sub(stop, start)) as loop:
                    k = builder.add(start, loop.index)
                    values = floats(builder, c.data, builder.mul(k, c_row))
                    if zeros is not None:
                        values = [builder.fsub(values[v], zeros[v]) for v in range(vectors)]
                    accumulate(k, [builder.fmul(values[v], scales[v]) for v in range(vectors)])
        else:
            w_row = builder.extract_value(w.strides, 0)
            with cgutils.for_range(builder, builder.sub(k1, k0)) as loop:
                k = builder.add(k0, loop.index)
                w_at = builder.mul(k, w_row)
                accumulate(k, [builder.load(element(builder, w.data, builder.add(w_at, ir.Constant(intp, v * lanes * 4)),
                                                    vector), align=4) for v in range(vectors)])
        for r in range(rows):
            row_at = builder.mul(builder.add(o0, ir.Constant(intp, r)), out_row)
            for v in range(vectors):
                column = builder.mul(builder.add(j0, ir.Constant(intp, v * lanes)), size)
                target = element(builder, out.data, builder.add(row_at, column), vector)
                builder.store(builder.fadd(builder.load(target, align=4), builder.load(accumulators[r][v])),
                              target, align=4)
        return context.get_dummy_value()

    return codegen


def row_switch(bodies: dict):
    """The codegen of an intrinsic tile(count, ...): one switch in the IR over each row count's tile
    body (`bodies`: rows -> codegen of the tile's other arguments; any other count: the first), so
    the kernels calling it need no branch per row count."""
    from llvmlite import ir  # noqa: PLC0415 - numba's own dependency: only when compiled kernels are on

    first = next(iter(bodies))

    def codegen(context, builder, signature, args):
        count, rest = args[0], args[1:]
        inner = signature.replace(args=signature.args[1:])
        blocks = {rows: builder.append_basic_block(f"tile.{rows}") for rows in bodies}
        done = builder.append_basic_block("tile.done")
        switch = builder.switch(count, blocks[first])
        for rows, block in blocks.items():
            switch.add_case(ir.Constant(count.type, rows), block)
            builder.position_at_end(block)
            bodies[rows](context, builder, inner, rest)
            builder.branch(done)  # from wherever the tile's loops left the builder
        builder.position_at_end(done)
        return context.get_dummy_value()

    return codegen


def _make_tiles(row_counts: range, codes: str | None = None, lanes: int = LANES, vectors: int = VECTORS):
    """A numba intrinsic tile(count, ...): the register tile of `count` rows (one of `row_counts`;
    anything else: the first), its other arguments those of _tile_codegen's tile (row_switch)."""
    from numba import types  # noqa: PLC0415
    from numba.extending import intrinsic  # noqa: PLC0415

    codegen = row_switch({rows: _tile_codegen(rows, codes, lanes, vectors) for rows in row_counts})

    index = types.intp
    if codes:
        def typer(typingctx, count, a, i0, c, s, z, group, out, o0, j0, k0, k1):
            return types.void(index, a, index, c, s, z, index, out, index, index, index, index), codegen
    else:
        def typer(typingctx, count, a, i0, w, out, o0, j0, k0, k1):
            return types.void(index, a, index, w, out, index, index, index, index), codegen

    typer.__name__ = (f"panel_tiles_{codes or 'float32'}_{row_counts[0]}_{row_counts[-1]}"
                      + ("" if lanes == LANES else f"_x{lanes}"))
    return intrinsic(typer)


_TILES: dict = {}


def tiles(lanes: int = LANES) -> dict:
    """The register tiles of 1..ROW_TILE rows (their row count an argument): `float_tile` on float32
    panels, `int8_tile` / `uint8_tile` on int8 / uint8 codes, `delta_tile` on int8 deltas (code -
    zero); `lanes` float32 lanes a vector (WIDE_LANES: the wide tiles, panels of WIDE_PANEL columns)."""
    if lanes not in _TILES:
        vectors = PANEL // LANES if lanes == LANES else WIDE_PANEL // lanes
        rows = range(1, ROW_TILE + 1)
        _TILES[lanes] = {f"{kind}_tile": _make_tiles(rows, codes, lanes, vectors) for kind, codes in _TILE_KINDS}
    return _TILES[lanes]


_TILE_KINDS = (("float", None), ("int8", "int8"), ("uint8", "uint8"), ("delta", "delta"))
HALF_PANEL = WIDE_PANEL // 2  # the half tiles' columns: two sixteen-lane vectors
HALF_ROWS = range(ROW_TILE + 1, 2 * ROW_TILE + 1)  # rows a half tile takes (2 x 12 accumulators at most)
_HALF_TILES: dict = {}


def half_tiles() -> dict:
    """Code tiles of 7-12 rows over half a wide panel (`int8_half`, `uint8_half`, `delta_half`): a
    decode step of 7-12 sequences rebuilds each weight once per half panel instead of once per six
    rows (twice), what bounds code GEMMs there."""
    if not _HALF_TILES:
        for kind, codes in _TILE_KINDS[1:]:
            _HALF_TILES[f"{kind}_half"] = _make_tiles(HALF_ROWS, codes, WIDE_LANES, HALF_PANEL // WIDE_LANES)
    return _HALF_TILES


@jit(fastmath=IN_ORDER, intrinsics=half_tiles)
def _half_tile(kind, count, a, i0, c, s, z, group, target, o0, j0, k0, k1):
    """The half tile of `count` (7-12) rows on code view c (HALF_PANEL columns of a wide code panel)
    with its scales s and zero points z (kind INT8, UINT8 or DELTA)."""
    if kind == 1:
        int8_half(count, a, i0, c, s, z, group, target, o0, j0, k0, k1)  # noqa: F821 - bound by `intrinsics`
    elif kind == 3:
        delta_half(count, a, i0, c, s, z, group, target, o0, j0, k0, k1)  # noqa: F821
    else:
        uint8_half(count, a, i0, c, s, z, group, target, o0, j0, k0, k1)  # noqa: F821


@jit(fastmath=IN_ORDER, intrinsics=tiles)
def _tile(kind, count, a, i0, w, c, s, z, group, target, o0, j0, k0, k1):
    """The register tile of `count` rows: on float32 panel w (kind FLOAT), else on code panel c with
    scales s and zero points z (kind INT8 or UINT8), or deltas c with scales s (kind DELTA)."""
    if kind == 0:
        float_tile(count, a, i0, w, target, o0, j0, k0, k1)  # noqa: F821 - bound by `intrinsics`
    elif kind == 1:
        int8_tile(count, a, i0, c, s, z, group, target, o0, j0, k0, k1)  # noqa: F821
    elif kind == 3:
        delta_tile(count, a, i0, c, s, z, group, target, o0, j0, k0, k1)  # noqa: F821
    else:
        uint8_tile(count, a, i0, c, s, z, group, target, o0, j0, k0, k1)  # noqa: F821


@jit(fastmath=IN_ORDER, calls=(_tile, _half_tile))
def _panel_columns(a, panels, codes, scale, zero, group, kind, bounds, p0, p1, n, out):
    """out[:, p0*P : p1*P] (cut at n) = a @ W's panels p0..p1-1 of P columns each, the chain kernel's
    sums: W as float32 panels (kind FLOAT; codes, scale, zero [1, 0, P] placeholders) or as code
    panels (kind INT8 / UINT8; panels a placeholder). P is the panels' width, the tiles' lanes x vectors."""
    rows = a.shape[0]
    panel = panels.shape[2] if kind == 0 else codes.shape[2]
    scratch = np.empty((2 * ROW_TILE, panel), np.float32)  # the last panel's columns past n land here
    halves = kind != 0 and panel == 2 * HALF_PANEL  # wide code panels: 7-12 rows on half tiles
    for p in range(p0, p1):
        w = panels[p if kind == 0 else 0]
        q = 0 if kind == 0 else p
        c, s, z = codes[q], scale[q], zero[q]
        j0 = p * panel
        width = min(panel, n - j0)
        for m in range(rows):
            for j in range(width):
                out[m, j0 + j] = 0.0
        for b in range(len(bounds) - 1):
            k0, k1 = bounds[b], bounds[b + 1]
            i0 = 0
            while i0 < rows:
                left = rows - i0
                if halves and ROW_TILE < left <= 2 * ROW_TILE:
                    if width < panel:
                        scratch[:, :] = 0.0
                    for h in range(0, panel, HALF_PANEL):
                        ch, sh, zh = c[:, h:h + HALF_PANEL], s[:, h:h + HALF_PANEL], z[:, h:h + HALF_PANEL]
                        if width == panel:
                            _half_tile(kind, left, a, i0, ch, sh, zh, group, out, i0, j0 + h, k0, k1)
                        else:
                            _half_tile(kind, left, a, i0, ch, sh, zh, group, scratch, 0, h, k0, k1)
                    if width < panel:
                        for m in range(left):
                            for j in range(width):
                                out[i0 + m, j0 + j] += scratch[m, j]
                    i0 = rows
                    continue
                count = min(ROW_TILE, left)
                if width == panel:
                    _tile(kind, count, a, i0, w, c, s, z, group, out, i0, j0, k0, k1)
                else:
                    scratch[:, :] = 0.0
                    _tile(kind, count, a, i0, w, c, s, z, group, scratch, 0, 0, k0, k1)
                    for m in range(count):
                        for j in range(width):
                            out[i0 + m, j0 + j] += scratch[m, j]
                i0 += count


@jit(fastmath=IN_ORDER, calls=(_panel_columns,))
def _panel_blocks(a, panels, codes, scale, zero, group, kind, bounds, blocks, n, out):
    """_panel_columns on each range of panels [blocks[i, 0], blocks[i, 1]) (the parallel build:
    one per thread)."""
    for i in prange(blocks.shape[0]):
        _panel_columns(a, panels, codes, scale, zero, group, kind, bounds, blocks[i, 0], blocks[i, 1], n, out)


def _renamed(fn, suffix: str):
    """A copy of a kernel's function under its own qualified name (numba's disk cache tells kernels
    apart by it), the same plain name (what `calls=` binds)."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__qualname__, copy.__module__, copy.__doc__ = fn.__qualname__ + suffix, fn.__module__, fn.__doc__
    return copy


# the same loops on the wide tiles (panels of WIDE_PANEL columns)
_wide_tile = jit(_renamed(_tile.fn, "_wide"), fastmath=IN_ORDER, intrinsics=lambda: tiles(WIDE_LANES))
_wide_columns = jit(_renamed(_panel_columns.fn, "_wide"), fastmath=IN_ORDER, calls=(_wide_tile, _half_tile))
_wide_blocks = jit(_renamed(_panel_blocks.fn, "_wide"), fastmath=IN_ORDER, calls=(_wide_columns,))


def has_wide_vectors() -> bool:
    """The CPU numba compiles for has 512-bit vectors (AVX-512F): the wide tiles fit its registers."""
    return cpu_features.has("avx512f")


FLOAT, INT8, UINT8, DELTA = 0, 1, 2, 3  # how the kernel reads W
_NO_FLOATS = np.zeros((1, 0, PANEL), np.float32)  # placeholders for the panels a call does not read
_NO_CODES = {np.dtype(np.int8): np.zeros((1, 0, PANEL), np.int8), np.dtype(np.uint8): np.zeros((1, 0, PANEL), np.uint8)}


def panel_product(a: np.ndarray, panels: np.ndarray, n: int, edges: np.ndarray) -> np.ndarray | None:
    """a [M, K] @ W [K, n] from W's `pack_panels`, K cut at `edges`; None when compiled kernels are off."""
    codes = _NO_CODES[np.dtype(np.int8)]
    return _product(a, panels, (codes, _NO_FLOATS, codes), 0, FLOAT, panels.shape[0], n, edges)


def code_panel_product(a: np.ndarray, packed: tuple, n: int, group: int, edges: np.ndarray) -> np.ndarray | None:
    """a [M, K] @ W [K, n] with W as code panels (`pack_code_panels`: codes, scales, zero points; or
    `pack_delta_panels`: deltas, scales, no zero points), K cut at `edges`; None when compiled kernels are off."""
    kind = DELTA if packed[2].shape[1] == 0 else INT8 if packed[0].dtype == np.int8 else UINT8
    return _product(a, _NO_FLOATS, packed, int(group), kind, packed[0].shape[0], n, edges)


def _product(a, panels, code_parts, group: int, kind: int, count: int, n: int, edges) -> np.ndarray | None:
    codes, scale, zero = code_parts
    is_wide = (panels if kind == FLOAT else codes).shape[2] == WIDE_PANEL
    columns, blocks = (_wide_columns, _wide_blocks) if is_wide else (_panel_columns, _panel_blocks)
    kernel = columns.get()
    if kernel is None:
        return None
    a = np.ascontiguousarray(a, np.float32)
    out = np.empty((a.shape[0], n), np.float32)
    over_column_blocks(panel_blocks(count, a.shape[0] * a.shape[1] * n), count,
                       lambda p0, p1: kernel(a, panels, codes, scale, zero, group, kind, edges, p0, p1, n, out),
                       blocks,
                       lambda spread, array: spread(a, panels, codes, scale, zero, group, kind, edges, array, n, out))
    return out
