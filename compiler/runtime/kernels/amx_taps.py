"""Dense convolutions on AMX-BF16 tiles with no window matrix: each kernel tap multiplies a shifted view
of the input (an implicit GEMM).

Why: amx_conv.py writes every window into tile panels first (an im2col): for a 3x3 convolution that
is nine times the input in writes, and on ResNet-50 the packing cost as much as the tile products.
Here the input is converted once, to the layout a B tile reads as it lies, and each tap's product
loads its B tiles straight from it at the tap's offset.

Layout. The image is split into stride phases (phase p of an axis holds padded coordinates s*g + p,
g over the phase grid G = ceil(padded / s)), and each phase holds words of bf16 channel pairs
(channel 2c in the low half), [channel pairs, phases, grid pixels + slack]. Output pixel (o1, .., on)
is column q = sum(o_i * g_i) of a padded output grid (g_i: the row-major strides of G); the value
tap t reads for it is in the phase of (d*t mod s) at q plus the tap's offset sum((d*t div s) * g_i).
So a tap's B tile (16 channel pairs x 16 columns) is 16 rows of 64 contiguous bytes, one grid's length
apart, for every tap, stride and dilation. Columns past an output row's end (the grid is wider than
the output by the kernel's reach) are computed and dropped when the output is compacted.

The weight is the left operand, [M, taps x channel pairs] words, k in (tap, channel) order with each
tap's channels padded to a tile's 32: convolutions whose channels that padding would inflate by more
than PAD_WASTE keep amx_conv.py's compact windows (an RGB stem). Each output is one chain of float32
sums over (tap, channel pair step) in that order, whatever the batch or the pixel's place.
"""

from __future__ import annotations

import math

import numpy as np

from .. import amx_gemm
from ..bf16_gemm import TILE_PAIRS, bf16_of, activation_pairs
from ..gemm_impls import parallel_for
from ..jit import IN_ORDER, jit
from .im2col import pooled

BLOCK = amx_gemm.BLOCK
CHANNELS_A_STEP = 2 * TILE_PAIRS  # the channels one tile step of a tap reads
PAD_WASTE = 1.25  # channels padded to CHANNELS_A_STEP may add at most this factor of work
# convolutions from this many multiply-adds are split between the cores by output rows: below it one
# core ran faster (ResNet-50's 3x3 convolutions, 116M each: split 0.61-0.84x one core; 64 channels at
# 112 x 112: 0.76x; bench/results/amx_split-2026-12-03.json); 128 channels at 128 x 128 ran 1.86x in
# one hour and 0.92x in another
SPLIT_MIN_MACS = 1 << 30


def tap_intrinsics() -> dict:
    """amx_gemm's configure / release, and amx_tap_block(a, i0, x, j0, offsets, pairs, out, o0, c0):
    out[o0:o0+32, c0:c0+32] = sum over taps t of A[i0:i0+32, t*pairs:(t+1)*pairs] @ X[:pairs,
    j0+offsets[t] : j0+offsets[t]+32] (words of pairs; `pairs` a multiple of TILE_PAIRS)."""
    from llvmlite import ir  # noqa: PLC0415 - numba's own dependency: only when compiled kernels are on
    from numba import types  # noqa: PLC0415
    from numba.core import cgutils  # noqa: PLC0415
    from numba.extending import intrinsic  # noqa: PLC0415

    i8 = ir.IntType(8)

    def block_codegen(context, builder, signature, args):
        a_val, i0, x_val, j0, offsets_val, pairs, out_val, o0, c0 = args
        a, x, offsets, out = (context.make_array(signature.args[i])(context, builder, v)
                              for i, v in ((0, a_val), (2, x_val), (4, offsets_val), (6, out_val)))
        ops = amx_gemm.tile_ops(builder.module)
        intp = i0.type
        tile = [ir.Constant(i8, t) for t in range(8)]
        four = ir.Constant(intp, 4)
        a_row, x_row, out_row = (builder.extract_value(v.strides, 0) for v in (a, x, out))
        taps = builder.extract_value(offsets.shape, 0)
        for t in range(4):
            builder.call(ops["zero"], [tile[t]])
        a_at = [builder.mul(builder.add(i0, ir.Constant(intp, r * amx_gemm.TILE_ROWS)), a_row) for r in range(2)]
        steps = builder.sdiv(pairs, ir.Constant(intp, TILE_PAIRS))
        with cgutils.for_range(builder, taps) as tap_loop:
            tap = tap_loop.index
            offset = builder.load(builder.gep(offsets.data, [tap]))
            x_at = [builder.mul(builder.add(builder.add(j0, offset), ir.Constant(intp, c * amx_gemm.TILE_ROWS)), four)
                    for c in range(2)]
            k_first = builder.mul(tap, pairs)
            with cgutils.for_range(builder, steps) as loop:
                kp = builder.mul(loop.index, ir.Constant(intp, TILE_PAIRS))
                k_bytes = builder.mul(builder.add(k_first, kp), four)
                for r in range(2):
                    builder.call(ops["load"], [tile[4 + r], amx_gemm.at(builder, a.data, builder.add(a_at[r], k_bytes)), a_row])
                x_rows = builder.mul(kp, x_row)
                for c in range(2):
                    builder.call(ops["load"], [tile[6 + c], amx_gemm.at(builder, x.data, builder.add(x_rows, x_at[c])), x_row])
                for r in range(2):
                    for c in range(2):
                        builder.call(ops["dot"], [tile[2 * r + c], tile[4 + r], tile[6 + c]])
        for r in range(2):
            for c in range(2):
                row = builder.add(o0, ir.Constant(intp, r * amx_gemm.TILE_ROWS))
                column = builder.add(c0, ir.Constant(intp, c * amx_gemm.TILE_ROWS))
                where = builder.add(builder.mul(row, out_row), builder.mul(column, four))
                builder.call(ops["store"], [tile[2 * r + c], amx_gemm.at(builder, out.data, where), out_row])
        return context.get_dummy_value()

    def block_typer(typingctx, a, i0, x, j0, offsets, pairs, out, o0, c0):
        index = types.intp
        return types.void(a, index, x, index, offsets, index, out, index, index), block_codegen

    block_typer.__name__ = "amx_tap_block"
    gemm = amx_gemm.intrinsics()
    return {"amx_configure": gemm["amx_configure"], "amx_release": gemm["amx_release"],
            "amx_tap_block": intrinsic(block_typer)}


@jit(fastmath=IN_ORDER, intrinsics=tap_intrinsics)
def _tap_blocks(a, x, offsets, pairs, config, rows, columns, i_lo, i_hi, j_lo, j_hi, rows_outer, out):
    """out[i_lo:i_hi, j_lo:j_hi] (rows cut at `rows`, columns at `columns`) of the tap products, in
    blocks of 32 x 32: all of a row block's column blocks in turn when `rows_outer` (a weight larger
    than the input stays in cache a row block at a time), else all row blocks of a column block."""
    scratch = np.empty((BLOCK, BLOCK), np.float32)  # a block cut by the edges of out
    row_blocks, column_blocks = -(-(i_hi - i_lo) // BLOCK), -(-(j_hi - j_lo) // BLOCK)
    amx_configure(config)  # noqa: F821 - bound by `intrinsics`
    for b in range(row_blocks * column_blocks):
        if rows_outer:
            i0, j0 = i_lo + (b // column_blocks) * BLOCK, j_lo + (b % column_blocks) * BLOCK
        else:
            i0, j0 = i_lo + (b % row_blocks) * BLOCK, j_lo + (b // row_blocks) * BLOCK
        height, width = min(BLOCK, rows - i0), min(BLOCK, columns - j0)
        if height == BLOCK and width == BLOCK:
            amx_tap_block(a, i0, x, j0, offsets, pairs, out, i0, j0)  # noqa: F821
        else:
            amx_tap_block(a, i0, x, j0, offsets, pairs, scratch, 0, 0)  # noqa: F821
            for m in range(height):
                for j in range(width):
                    out[i0 + m, j0 + j] = scratch[m, j]
    amx_release()  # noqa: F821


@jit(fastmath=set(), calls=(bf16_of,))
def _phase_pairs(x, pads, strides, grid, phases, c_lo, c_hi, out):
    """out[c_lo:c_hi] = channel pairs c_lo..c_hi-1 of image x [C, D1, D2, D3] (float32 bits) as words
    of bf16 pairs in the stride phases `phases` (the ones some tap reads), [pairs, phases, grid pixels
    + slack] (see the module docstring); zeros where the padded coordinate is padding, past the
    channels, and in the slack."""
    channels, d1, d2, d3 = x.shape
    s1, s2, s3 = strides[0], strides[1], strides[2]
    g1, g2, g3 = grid[0], grid[1], grid[2]
    cells = g1 * g2 * g3
    for cp in range(c_lo, c_hi):
        low, high = 2 * cp, 2 * cp + 1
        for index in range(phases.size):
            ph = phases[index]
            p1, p2, p3 = ph // (s2 * s3), (ph // s3) % s2, ph % s3
            row = out[cp, index]
            row[cells:] = 0
            # the grid columns c whose coordinate c * s3 + p3 - pads[2] lies inside the image
            c_first = min(g3, max(0, -(-(pads[2] - p3) // s3)))
            c_end = max(c_first, min(g3, -(-(d3 + pads[2] - p3) // s3)))
            shift = p3 - pads[2]
            for a in range(g1):
                i1 = a * s1 + p1 - pads[0]
                for b in range(g2):
                    i2 = b * s2 + p2 - pads[1]
                    at = (a * g2 + b) * g3
                    if low >= channels or not (0 <= i1 < d1 and 0 <= i2 < d2):
                        row[at:at + g3] = 0
                        continue
                    row[at:at + c_first] = 0
                    row[at + c_end:at + g3] = 0
                    xl = x[low, i1, i2]
                    if high >= channels:
                        for c in range(c_first, c_end):
                            row[at + c] = bf16_of(xl[c * s3 + shift])
                    elif s3 == 1:  # contiguous loads: vectorized
                        xh = x[high, i1, i2]
                        for c in range(c_first, c_end):
                            row[at + c] = bf16_of(xl[c + shift]) | (bf16_of(xh[c + shift]) << np.uint32(16))
                    else:
                        xh = x[high, i1, i2]
                        for c in range(c_first, c_end):
                            row[at + c] = bf16_of(xl[c * s3 + shift]) | (bf16_of(xh[c * s3 + shift]) << np.uint32(16))


class TapLayout:
    """Where each tap reads in the phase layout of one convolution geometry (3 spatial dims, unit
    ones prepended to 1-D and 2-D convolutions)."""

    def __init__(self, spatial, kernel, strides, dilations, pads_begin, pads_end, out_dims):
        lead = 3 - len(spatial)
        spatial, kernel, out_dims = (1,) * lead + tuple(spatial), (1,) * lead + tuple(kernel), (1,) * lead + tuple(out_dims)
        strides, dilations = (1,) * lead + tuple(strides), (1,) * lead + tuple(dilations)
        begin, end = (0,) * lead + tuple(pads_begin), (0,) * lead + tuple(pads_end)
        padded = [d + b + e for d, b, e in zip(spatial, begin, end)]
        self.grid = np.array([-(-p // s) for p, s in zip(padded, strides)], np.int64)
        g = (int(self.grid[1] * self.grid[2]), int(self.grid[2]), 1)  # row-major strides of the grid
        cells = int(np.prod(self.grid))
        self.columns = sum((o - 1) * step for o, step in zip(out_dims, g)) + 1  # the last output pixel's column + 1
        offsets = []
        for taps in np.ndindex(*kernel):
            reach = [t * d for t, d in zip(taps, dilations)]
            phase = ((reach[0] % strides[0]) * strides[1] + reach[1] % strides[1]) * strides[2] + reach[2] % strides[2]
            offsets.append((phase, sum((r // s) * step for r, s, step in zip(reach, strides, g))))
        # a phase's row holds its cells and the slack the last column block reads past them
        blocks_end = -(-self.columns // BLOCK) * BLOCK
        self.row_length = -(-max(cells, max(o for _, o in offsets) + blocks_end) // 16) * 16
        # only the phases some tap reads are converted (a strided pointwise convolution reads one)
        self.phases = np.array(sorted({phase for phase, _ in offsets}), np.int64)
        slot = {phase: index for index, phase in enumerate(self.phases.tolist())}
        self.offsets = np.array([slot[phase] * self.row_length + o for phase, o in offsets], np.int64)
        self.pads = np.array(begin, np.int64)
        self.strides = np.array(strides, np.int64)
        # output pixel (o1, o2, o3) at column o1*g1 + o2*g2 + o3 of the products
        self.out_dims, self.out_strides = tuple(out_dims[lead:]), g[lead:]


def channel_pairs(channels: int) -> int:
    """The pairs a tap of `channels` input channels reads, padded to whole tile steps."""
    return -(-channels // CHANNELS_A_STEP) * TILE_PAIRS


def applies(channels: int, kernel) -> bool:
    """Whether a convolution of `channels` inputs is better done by taps than by amx_conv.py's windows:
    padding each tap's channels to a tile step costs little enough (PAD_WASTE), and it has taps to
    save: a pointwise convolution's windows are its input's pixels, packed as fast, and its products
    ran faster from the packed panels (a strided one of 256 channels at 56 x 56: 0.84 ms by taps,
    0.65 by windows)."""
    return 2 * channel_pairs(channels) <= PAD_WASTE * channels and math.prod(kernel) > 1


def _weight_words(w: np.ndarray, memo: dict) -> np.ndarray | None:
    """w [M, C, *kernel] as the left operand: [M padded to BLOCK, taps x channel_pairs(C)] words, packed once."""
    key = ("amx-taps-weight", id(w), w.shape)
    held = memo.get(key)
    if held is not None and held[0] is w:
        return held[1]
    m, c = w.shape[:2]
    taps, pairs = math.prod(w.shape[2:]), channel_pairs(c)
    by_tap = np.zeros((m, taps, 2 * pairs), np.float32)
    by_tap[:, :, :c] = w.reshape(m, c, taps).transpose(0, 2, 1)
    words = activation_pairs(by_tap.reshape(m, taps * 2 * pairs), -(-m // BLOCK) * BLOCK, taps * pairs)
    memo[key] = (w, words)  # the array itself is held so its id is not reused while cached
    return words


def tap_conv(x: np.ndarray, w: np.ndarray, strides, dilations, pads_begin, pads_end, out_dims,
             memo: dict) -> np.ndarray | None:
    """The convolution of x [N, C, *spatial] (unpadded) with w [M, C, *kernel] (no bias) on the tiles,
    float32 [N, M, *out_dims] from bf16-rounded operands; None where the kernels are not usable here.
    Large ones are split between the cores by output rows (see _split_rows)."""
    if not amx_gemm.has_amx_bf16():  # also asks the kernel for the tiles (an illegal instruction without)
        return None
    convert, product = _phase_pairs.get(), _tap_blocks.get()
    a = _weight_words(w, memo)
    if convert is None or product is None or a is None:
        return None
    n, m = x.shape[0], w.shape[0]
    y = np.empty((n, m) + tuple(out_dims), np.float32)
    geometry = (tuple(strides), tuple(dilations), tuple(pads_begin), tuple(pads_end), tuple(out_dims))
    split = n * m * math.prod(out_dims) * math.prod(w.shape[1:]) >= SPLIT_MIN_MACS
    if split and out_dims[0] >= 2:
        halves = _split_rows(x.shape[2], w.shape[2], geometry)
        parallel_for(2, lambda i: _rows((convert, product), x, w, a, *halves[i], memo, y))
    else:
        _rows((convert, product), x, w, a, slice(None), geometry, slice(None), memo, y, split_rows=split)
    return y


def _split_rows(height: int, reach: int, geometry) -> list:
    """The two halves of a convolution along its first spatial axis: (the input rows it reads, its
    geometry, the output rows it writes). Each core converts its own rows (and the few both halves
    read) into its own cache and buffers."""
    strides, dilations, begin, end, out_dims = geometry
    rows, halves = out_dims[0], []
    for r0, r1 in ((0, rows // 2), (rows // 2, rows)):
        first = r0 * strides[0] - begin[0]  # the padded window rows, in input coordinates
        last = (r1 - 1) * strides[0] + dilations[0] * (reach - 1) + 1 - begin[0]
        part = (strides, dilations, (max(0, -first),) + begin[1:], (max(0, last - height),) + end[1:],
                (r1 - r0,) + out_dims[1:])
        halves.append((slice(max(0, first), min(height, last)), part, slice(r0, r1)))
    return halves


def _rows(kernels, x, w, a, rows, geometry, out_rows, memo: dict, y, split_rows: bool = False):
    """y[:, :, out_rows] = the convolution of x[:, :, rows] (the input rows those outputs read) with
    `geometry` (strides, dilations, pads begin / end, out dims of this part) by the compiled
    `kernels` (_phase_pairs, _tap_blocks); `split_rows`: the products of each image are shared with
    the helper thread by output channels."""
    convert, product = kernels
    x = x[:, :, rows]
    strides, dilations, begin, end, out_dims = geometry
    key = ("amx-taps-layout", x.shape[2:], w.shape[2:], geometry)
    layout = memo.get(key)
    if layout is None:
        layout = memo[key] = TapLayout(x.shape[2:], w.shape[2:], strides, dilations, begin, end, out_dims)
    n, c = x.shape[:2]
    m, pairs = w.shape[0], channel_pairs(c)
    x4 = np.ascontiguousarray(x).reshape((n, c) + (1,) * (5 - x.ndim) + x.shape[2:]).view(np.uint32)
    size = pairs * layout.phases.size * layout.row_length
    words = pooled("amx-taps-input", size, np.uint32)[:size].reshape(pairs, layout.phases.size, layout.row_length)
    flat_words = words.reshape(pairs, -1)
    products = pooled("amx-taps-out", m * layout.columns, np.float32)[:m * layout.columns].reshape(m, layout.columns)
    rows_outer = a.nbytes > words.nbytes  # the larger operand stays in cache across the other's blocks
    row_half = -(-m // (2 * BLOCK)) * BLOCK
    compact = np.lib.stride_tricks.as_strided(products, (m,) + layout.out_dims, (layout.columns * 4,) + tuple(
        4 * s for s in layout.out_strides))

    def blocks(i_lo, i_hi):
        product(a, flat_words, layout.offsets, pairs, amx_gemm.CONFIG, m, layout.columns, i_lo, i_hi, 0, layout.columns,
                rows_outer, products)

    for image in range(n):
        convert(x4[image], layout.pads, layout.strides, layout.grid, layout.phases, 0, pairs, words)
        if split_rows and row_half < m:
            parallel_for(2, lambda i: blocks(*((0, row_half) if i == 0 else (row_half, m))))
        else:
            blocks(0, m)
        y[image, :, out_rows] = compact
