"""Convolutions of a bf16 plan on AMX-BF16 tiles: each image one GEMM, weights [M, K] times windows [K, pixels].

Why: a bf16 plan's convolutions read bf16 values (the build rounds activation and weight; see
bf16_sites.py) and summed them as float32 sgemm, or in onnxruntime between Casts: ResNet-50's bf16
plan ran 1.42x its fp32 plan. On AMX one `tdpbf16ps` does 16 x 16 x 32 products (amx_gemm.py):
over ResNet-50's convolutions this runs 0.38x infc's float32 kernel and 0.61x onnxruntime's
one-node float32 convolutions on a Sapphire Rapids core (bench/amx_conv.py).

Layout, chosen so the output is NCHW as it comes (no transpose after): the convolution's weight,
[M, C/group... = K] rows, is the GEMM's left operand, its k pairs packed once per weight
(`bf16_gemm.activation_pairs`, rows padded to the tile block); the windows of one image are the
right operand, written straight into the panels amx_gemm's kernel reads ([pixels / 64, K pairs,
64] words of bf16 k pairs, `_pack_windows`), so one pass over the padded input is the whole
im2col. Products of two bf16 values are exact in float32, so the sums are a float32 GEMM's up to
the order of its additions, which is fixed per output by K alone (batch invariant).

Only dense convolutions of one group and 1 to 3 spatial dims take this path (depthwise ones are
memory-bound and keep their kernels); `tiled_conv` returns None where it does not apply or AMX is
not usable, and the caller keeps its float32 path.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .. import aligned, amx_gemm
from ..bf16_gemm import PANEL, TILE_PAIRS, bf16_of, activation_pairs
from ..gemm_impls import parallel_for
from ..jit import enabled as jit_enabled
from ..jit import jit
from .im2col import pooled

# panels packed together, pair by pair: each pair's two input rows are read in runs of this many
# panels' pixels (a few KB), which the prefetchers follow; one panel at a time, a 256-channel input
# larger than L2 was read in 256 interleaved streams of 256 bytes, at 0.7 ns a word
PANEL_GROUP = 8
CHUNK_BYTES = 8 << 20  # packed windows held at a time (a few MB: the core's L2 and a little more)


@jit(fastmath=set(), calls=(bf16_of,))
def _pack_windows(x, k_offsets, runs, panel_runs, step, out):
    """out [panels, pairs, PANEL] words = bf16 k pairs of the windows of one padded image x (its
    float32 bits, flat), a word's low half the even k. Pixels come in runs along the last output
    dim (cut at panel edges): run r = (first lane, length, offset of its first pixel), the next
    pixel `step` elements on; the runs of panel p are panel_runs[p]..panel_runs[p + 1]. Value k of a
    pixel is x[k_offsets[k] + its offset]; k_offsets is -1 past K (zeros), lanes past the last
    pixel are zeros."""
    count, pairs = out.shape[0], out.shape[1]
    for group in range(0, count, PANEL_GROUP):
        for kp in range(pairs):
            low, high = k_offsets[2 * kp], k_offsets[2 * kp + 1]
            for p in range(group, min(group + PANEL_GROUP, count)):
                row = out[p, kp]
                if low < 0:
                    row[:] = 0
                    continue
                for r in range(panel_runs[p], panel_runs[p + 1]):
                    lane, length, at = runs[r, 0], runs[r, 1], runs[r, 2]
                    if high < 0:
                        for t in range(length):
                            row[lane + t] = bf16_of(x[low + at + t * step])
                    elif step == 1:  # contiguous loads: vectorized
                        a, b = x[low + at:low + at + length], x[high + at:high + at + length]
                        for t in range(length):
                            row[lane + t] = bf16_of(a[t]) | (bf16_of(b[t]) << np.uint32(16))
                    else:
                        for t in range(length):
                            row[lane + t] = bf16_of(x[low + at + t * step]) | (bf16_of(x[high + at + t * step]) << np.uint32(16))
                filled = runs[panel_runs[p + 1] - 1, 0] + runs[panel_runs[p + 1] - 1, 1]
                row[filled:] = 0


def _layout(shape, kernel, strides, dilations, out_dims, pairs: int, memo: dict):
    """(k offsets [2 * pairs], pixel runs, panel run ranges, step) of _pack_windows for a padded image
    of `shape` [C, *spatial] flattened, cached per geometry: k runs over (c, kernel taps) as the
    weight's rows do; pixels over the output in row-major order, a run per row of the last dim and panel
    (rows that lie end to end in memory, as a pointwise convolution's do, make one run)."""
    key = ("amx-conv-layout", shape, kernel, strides, dilations, out_dims, pairs)
    held = memo.get(key)
    if held is None:
        c, spatial = shape[0], shape[1:]
        place = np.cumprod((1,) + spatial[::-1])[::-1]  # element strides of [C, *spatial]
        taps = np.zeros(1, np.int64)
        starts = np.zeros(1, np.int64)  # the offset of each output row's first pixel
        for axis, (size, gap) in enumerate(zip(kernel, dilations)):
            taps = (taps[:, None] + np.arange(size) * gap * place[axis + 1]).ravel()
        for axis in range(len(out_dims) - 1):
            starts = (starts[:, None] + np.arange(out_dims[axis]) * strides[axis] * place[axis + 1]).ravel()
        k_offsets = np.full(2 * pairs, -1, np.int64)
        k_offsets[:c * taps.size] = (np.arange(c)[:, None] * place[0] + taps).ravel()
        width, step = out_dims[-1], int(strides[-1])
        runs, panel_runs = [], [0]
        for index, start in enumerate(starts.tolist()):
            pixel, end = index * width, (index + 1) * width
            while pixel < end:
                cut = min(end, (pixel // PANEL + 1) * PANEL)
                lane, at = pixel % PANEL, start + (pixel - index * width) * step
                last = runs[-1] if len(runs) > panel_runs[-1] else None  # the panel's run before, if any
                if last is not None and last[0] + last[1] == lane and last[2] + last[1] * step == at:
                    runs[-1] = (last[0], last[1] + cut - pixel, last[2])  # rows that lie end to end: one run
                else:
                    runs.append((lane, cut - pixel, at))
                if cut % PANEL == 0 or cut == len(starts) * width:
                    panel_runs.append(len(runs))
                pixel = cut
        held = memo[key] = (k_offsets, np.array(runs, np.int64).reshape(-1, 3), np.array(panel_runs, np.int64), step)
    return held


def applies(x_shape, w_shape, group: int) -> bool:
    """A dense convolution (one group) of 1-3 spatial dims large enough for tiles."""
    spatial = len(x_shape) - 2
    return group == 1 and 1 <= spatial <= 3 and len(w_shape) == len(x_shape) and x_shape[1] == w_shape[1]


def _weight_pairs(w: np.ndarray, memo: dict) -> np.ndarray | None:
    """The weight's k pairs as the kernel's left operand, packed once per weight array."""
    key = ("amx-conv-weight", id(w), w.shape)
    held = memo.get(key)
    if held is not None and held[0] is w:
        return held[1]
    m, k = w.shape[0], math.prod(w.shape[1:])
    pairs = activation_pairs(w.reshape(m, k), -(-m // amx_gemm.BLOCK) * amx_gemm.BLOCK, -(-k // (2 * TILE_PAIRS)) * TILE_PAIRS)
    memo[key] = (w, pairs)  # the array itself is held so its id is not reused while cached
    return pairs


def padded_input(x: np.ndarray, begin, end) -> np.ndarray:
    """x with zeros around its spatial dims, in this thread's scratch buffer (only the borders are
    zeroed; the buffer is read by the packing alone, before the next convolution asks for it)."""
    if not any(begin) and not any(end):
        return x
    shape = x.shape[:2] + tuple(d + b + e for d, b, e in zip(x.shape[2:], begin, end))
    xp = pooled("amx-conv-padded", math.prod(shape), x.dtype)[:math.prod(shape)].reshape(shape)
    inner = tuple(slice(b, b + d) for b, d in zip(begin, x.shape[2:]))
    for axis, (b, d) in enumerate(zip(begin, x.shape[2:])):
        before = (slice(None), slice(None)) + inner[:axis]
        xp[before + (slice(0, b),)] = 0.0
        xp[before + (slice(b + d, None),)] = 0.0
        inner = inner[:axis] + (slice(None),) + inner[axis + 1:]
    xp[(slice(None), slice(None)) + tuple(slice(b, b + d) for b, d in zip(begin, x.shape[2:]))] = x
    return xp


def tiled_conv(xp: np.ndarray, w: np.ndarray, strides, dilations, out_dims, memo: dict) -> np.ndarray | None:
    """The convolution of padded input xp [N, C, *spatial] with w [M, C, *kernel] (no bias), float32
    [N, M, *out_dims] from bf16-rounded operands; None where AMX-BF16 or compiled kernels are not
    usable here, or the convolution is not dense."""
    if not amx_gemm.has_amx_bf16() or xp.dtype != np.float32 or w.dtype != np.float32 or not applies(xp.shape, w.shape, 1):
        return None
    pack, product = _pack_windows.get(), amx_gemm._amx_columns.get()
    a = _weight_pairs(w, memo)
    if pack is None or product is None or a is None:
        return None
    n, c = xp.shape[:2]
    m = w.shape[0]
    pixels = math.prod(out_dims)
    k_offsets, runs, panel_runs, step = _layout(xp.shape[1:], tuple(w.shape[2:]), tuple(strides), tuple(dilations),
                                                tuple(out_dims), a.shape[1], memo)
    count = -(-pixels // PANEL)
    # panels packed and multiplied a chunk at a time: a 3x3 convolution of 64 channels at 1024 x 1024
    # would otherwise pack 1.2 GB; one buffer for every convolution of this thread (a fresh one per
    # call cost its page faults)
    chunk = min(count, max(2, CHUNK_BYTES // (a.shape[1] * PANEL * 4)))
    panels = pooled("amx-conv-panels", chunk * a.shape[1] * PANEL, np.uint32)[:chunk * a.shape[1] * PANEL].reshape(
        chunk, a.shape[1], PANEL)
    y = aligned.empty((n, m, pixels), np.float32)  # tile stores on whole cache lines
    split = m * pixels * math.prod(w.shape[1:]) >= amx_gemm.SPLIT_MIN_MACS
    row_half = -(-m // (2 * amx_gemm.BLOCK)) * amx_gemm.BLOCK  # rows split at a tile block edge
    flat = np.ascontiguousarray(xp).reshape(n, -1).view(np.uint32)
    for image, first in itertools.product(range(n), range(0, count, chunk)):
        last = min(count, first + chunk)
        out = y[image, :, first * PANEL:]  # the chunk's columns on: panel p of the chunk is panel first + p

        def columns(p0: int, p1: int, image=image, first=first, out=out):
            """Panels p0..p1-1 of the chunk: packed, then multiplied while they are in this core's cache."""
            pack(flat[image], k_offsets, runs, panel_runs[first + p0:first + p1 + 1], step, panels[p0:p1])
            product(a, panels, amx_gemm.CONFIG, m, p0, p1, out.shape[1], amx_gemm.K_BLOCK, out)

        def rows(r0: int, r1: int, out=out):
            """Output rows r0..r1-1 (one panel's pixels: the weight's rows are the larger operand)."""
            block_rows = -(-(r1 - r0) // amx_gemm.BLOCK) * amx_gemm.BLOCK  # the kernel reads whole blocks of a
            product(a[r0:r0 + block_rows], panels, amx_gemm.CONFIG, r1 - r0, 0, 1, out.shape[1], amx_gemm.K_BLOCK,
                    out[r0:r1])

        size = last - first
        if split and size > 1:
            half = size // 2
            parallel_for(2, lambda i: columns(*((0, half) if i == 0 else (half, size))))
        elif split and row_half < m:
            pack(flat[image], k_offsets, runs, panel_runs[first:last + 1], step, panels[:1])
            parallel_for(2, lambda i: rows(*((0, row_half) if i == 0 else (row_half, m))))
        else:
            columns(0, size)
    return y.reshape((n, m) + tuple(out_dims))


TILED_STEPS = {("", "Conv"), ("com.microsoft", "FusedConv"), ("infc.cpu", "ConvEpilogue")}
ROUND_STEP, BF16 = ("infc.cpu", "RoundTo"), 16


def skip_rounding_before_tiles(steps: list[dict], keep: set[str]) -> list[dict]:
    """The CPU executor's program without the bf16 roundings (RoundTo, runtime/cast_fold.py) that only
    tiled convolutions read, as their activation: packing the windows rounds each value to bf16 the
    same way (nearest, ties to even), so the tiles see the same operands, one pass over memory
    fewer. Only where the tiles run here: a convolution that falls back to float32 needs its input rounded."""
    if not (amx_gemm.has_amx_bf16() and jit_enabled()):
        return steps
    readers: dict[str, list[tuple[dict, int]]] = {}
    for step in steps:
        for position, name in enumerate(step["inputs"]):
            if name:
                readers.setdefault(name, []).append((step, position))
    rename, kept = {}, []
    for step in steps:
        key = (step.get("domain") or "", step["op"])
        out = step["outputs"][0] if step["outputs"] else ""
        if key == ROUND_STEP and (step.get("attrs") or {}).get("to") == BF16 and out not in keep and readers.get(out) \
                and all(position == 0 and reader.get("bf16_tiles") and not reader.get("tactic")
                        and (reader.get("domain") or "", reader["op"]) in TILED_STEPS
                        for reader, position in readers[out]):
            rename[out] = step["inputs"][0]
            continue
        kept.append(step)
    if not rename:
        return steps
    return [{**step, "inputs": [rename.get(name, name) for name in step["inputs"]]} if any(
        name in rename for name in step["inputs"]) else step for step in kept]
