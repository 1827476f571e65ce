"""A compiled skinny GEMM whose sums are the blocked BLAS GEMM's, bit for bit (decoder plans, M <= 8).

Why: a decoder step's GEMMs have one row per running sequence. To keep a sequence's logits
independent of its batch, runtime/invariant_gemm.py runs every row count through the BLAS blocked
GEMM, padding small ones up to the shape's threshold; for one row that costs 2-5x a GEMV, because
the GEMM packs the whole weight on every call. This kernel computes what the blocked GEMM computes
without packing, streaming the weight once.

What the blocked GEMM computes (OpenBLAS's level-3 driver, checked on this machine): K is cut into
blocks by a rule of (K, Q, U) alone, Q and U being the library's block depth and unroll; within a
block every output element is one chain of fused multiply-adds in k order, starting from zero, and
the blocks' chains are added to the output in order. This kernel does the same: `IN_ORDER`
fastmath lets LLVM fuse each multiply-add and vectorize across output columns, never reorder.
invariant_gemm finds the block rule by comparing against the BLAS itself and uses this kernel only
for shapes where it matched bit for bit; everything else keeps the BLAS recipe.

The inner loop takes four k steps per pass over a tile of columns (eight for a single row; each
element's chain stays in k order; the accumulator row is read and written once per pass), two rows
at a time (they share the weight loads), and tiles the columns so a tile's accumulators and weight
rows stay in L1.
Measured against the padded recipe (1-thread BLAS per column block, 576 x 49152 and 576 x 3072):
1 row 1.5-2.5x faster, 8 rows 1.2x; from 16 rows the BLAS GEMM is faster.
"""

from __future__ import annotations

import time
from functools import lru_cache

import numpy as np

from .gemm_impls import Backoff, parallel_for
from .jit import IN_ORDER, jit, prange

TILE = 1024  # columns per tile: 4 weight rows + 8 accumulator rows of it fit in L1
# OpenBLAS's SGEMM block depths (GEMM_Q) on the cores it ships kernels for, tried first
COMMON_DEPTHS = (448, 384, 256, 512, 320, 640, 768, 192, 128, 1024, 352, 224, 240, 480)
UNROLLS = (1, 2, 4, 8, 16, 32, 64)


@jit(fastmath=IN_ORDER)
def _chain_columns(a, w, bounds, n0, n1, out):
    """out[:, n0:n1] = a @ w[:, n0:n1], each element summed block by block as the blocked GEMM does."""
    rows = a.shape[0]
    acc = np.empty((rows, TILE), np.float32)
    for t0 in range(n0, n1, TILE):
        width = min(TILE, n1 - t0)
        for m in range(rows):
            for j in range(width):
                out[m, t0 + j] = 0.0
        for b in range(len(bounds) - 1):
            for m in range(rows):
                for j in range(width):
                    acc[m, j] = 0.0
            k, end = bounds[b], bounds[b + 1]
            while rows == 1 and k + 8 <= end:  # one row: eight k steps a pass (measured 4-9% faster)
                w0, w1 = w[k, t0:t0 + width], w[k + 1, t0:t0 + width]
                w2, w3 = w[k + 2, t0:t0 + width], w[k + 3, t0:t0 + width]
                w4, w5 = w[k + 4, t0:t0 + width], w[k + 5, t0:t0 + width]
                w6, w7 = w[k + 6, t0:t0 + width], w[k + 7, t0:t0 + width]
                x0, x1, x2, x3 = a[0, k], a[0, k + 1], a[0, k + 2], a[0, k + 3]
                x4, x5, x6, x7 = a[0, k + 4], a[0, k + 5], a[0, k + 6], a[0, k + 7]
                r0 = acc[0]
                for j in range(width):
                    r = (((r0[j] + x0 * w0[j]) + x1 * w1[j]) + x2 * w2[j]) + x3 * w3[j]
                    r0[j] = (((r + x4 * w4[j]) + x5 * w5[j]) + x6 * w6[j]) + x7 * w7[j]
                k += 8
            while k + 4 <= end:
                w0, w1 = w[k, t0:t0 + width], w[k + 1, t0:t0 + width]
                w2, w3 = w[k + 2, t0:t0 + width], w[k + 3, t0:t0 + width]
                m = 0
                while m + 2 <= rows:  # two rows share each weight load
                    x0, x1, x2, x3 = a[m, k], a[m, k + 1], a[m, k + 2], a[m, k + 3]
                    y0, y1, y2, y3 = a[m + 1, k], a[m + 1, k + 1], a[m + 1, k + 2], a[m + 1, k + 3]
                    r0, r1 = acc[m], acc[m + 1]
                    for j in range(width):
                        v0, v1, v2, v3 = w0[j], w1[j], w2[j], w3[j]
                        r0[j] = (((r0[j] + x0 * v0) + x1 * v1) + x2 * v2) + x3 * v3
                        r1[j] = (((r1[j] + y0 * v0) + y1 * v1) + y2 * v2) + y3 * v3
                    m += 2
                if m < rows:
                    x0, x1, x2, x3 = a[m, k], a[m, k + 1], a[m, k + 2], a[m, k + 3]
                    r0 = acc[m]
                    for j in range(width):
                        v0, v1, v2, v3 = w0[j], w1[j], w2[j], w3[j]
                        r0[j] = (((r0[j] + x0 * v0) + x1 * v1) + x2 * v2) + x3 * v3
                k += 4
            while k < end:
                w0 = w[k, t0:t0 + width]
                for m in range(rows):
                    x0 = a[m, k]
                    row = acc[m]
                    for j in range(width):
                        row[j] = row[j] + x0 * w0[j]
                k += 1
            for m in range(rows):
                for j in range(width):
                    out[m, t0 + j] += acc[m, j]


@jit(fastmath=IN_ORDER, calls=(_chain_columns,))
def _chain_blocks(a, w, bounds, blocks, out):
    """_chain_columns on each column block [blocks[i, 0], blocks[i, 1]) (the parallel build: one
    per thread)."""
    for i in prange(blocks.shape[0]):
        _chain_columns(a, w, bounds, blocks[i, 0], blocks[i, 1], out)


@lru_cache(maxsize=256)
def block_array(blocks: tuple) -> np.ndarray:
    """Column blocks ((n0, n1), ...) as the [count, 2] int64 array the parallel kernels take."""
    return np.asarray(blocks, np.int64).reshape(-1, 2)


def k_blocks(k: int, depth: int, unroll: int) -> tuple[int, ...]:
    """Block edges of K under OpenBLAS's rule: whole blocks of `depth` while at least two remain,
    then the rest in one block, or in two halves (rounded up to `unroll`) when it exceeds `depth`."""
    edges, start = [0], 0
    while start < k:
        size = k - start
        if size >= 2 * depth:
            size = depth
        elif size > depth:
            size = min(size, -(-(size // 2) // unroll) * unroll)  # a large unroll cannot overrun K
        start += size
        edges.append(start)
    return tuple(edges)


def candidate_rules(k: int, first: tuple[int, int] | None = None) -> list[tuple[tuple[int, int], tuple[int, ...]]]:
    """((depth, unroll), edges) for every distinct way the rule can cut K, likeliest first."""
    depths = list(COMMON_DEPTHS) + [d for d in range(8, 2 * k + 8, 8) if d not in COMMON_DEPTHS]
    rules = ([first] if first else []) + [(d, u) for d in depths for u in UNROLLS]
    seen, out = set(), []
    for depth, unroll in rules:
        edges = k_blocks(k, depth, unroll)
        if edges not in seen:
            seen.add(edges)
            out.append(((depth, unroll), edges))
    return out


def chain_product(a: np.ndarray, w: np.ndarray, edges: np.ndarray, blocks, out: np.ndarray) -> np.ndarray | None:
    """a [M, K] @ w [K, N] into out [M, N], K cut at `edges`, columns in `blocks` (shared with the
    helper thread); None when compiled kernels are off (the caller keeps the BLAS recipe)."""
    kernel = _chain_columns.get()
    if kernel is None:
        return None
    over_column_blocks(blocks, w.shape[1], lambda n0, n1: kernel(a, w, edges, n0, n1, out), _chain_blocks,
                       lambda spread, array: spread(a, w, edges, array, out))
    return out


def over_column_blocks(blocks, n: int, run_block, blocks_kernel, run_spread) -> None:
    """The column blocks of a chain kernel's call: one block at once; several on numba's threads
    (`blocks_kernel`'s parallel build, called as run_spread(build, block array): no GIL round trip
    per call, jit.py), else shared with the helper thread (run_block(n0, n1) each).

    A parallel loop ends when both threads have done their block, so when the other core is busy
    with another process the call waits for numba's thread to be scheduled (on a machine loaded to
    3-4 runnable threads a core, SmolLM2 decode steps took 1.1-1.45x longer on two threads than on
    one). So a call whose thread sat idle waiting for that long (wall time past its own CPU time,
    the rule parallel_for's helper follows) keeps the next 2, 4, ... 64 calls on this thread, then
    tries again. Columns never change a sum, so neither does this."""
    if len(blocks) == 1:
        run_block(0, n)
        return
    spread = blocks_kernel.get_parallel()
    if spread is None:
        parallel_for(len(blocks), lambda i: run_block(blocks[i][0], blocks[i][1]))
        return
    spread_or_alone(lambda: run_spread(spread, block_array(tuple(blocks))), lambda: run_block(0, n))


def spread_or_alone(run_spread, run_alone) -> None:
    """run_spread() (a loop on numba's threads), or run_alone() on this thread while the backoff
    says the other core is taken (see over_column_blocks). One backoff for the GEMMs and the paged
    attention: a busy core is busy for both."""
    if _SPREAD_BACKOFF.skip:
        _SPREAD_BACKOFF.skip -= 1
        run_alone()
        return
    started, own_started = time.perf_counter(), time.thread_time()
    run_spread()
    finished = time.perf_counter()
    _SPREAD_BACKOFF.record(started, started + (time.thread_time() - own_started), finished)


_SPREAD_BACKOFF = Backoff()
