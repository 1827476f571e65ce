"""Compiled (numba, see runtime/jit.py) attention of infc.PagedAttention for float32 plans: K and V
are read straight from the pools through the block tables (no gathered copies), for decode rows and
prefill chunks alike, where the NumPy path gathers float64 copies of every sequence's context.

Batch and chunk invariance (decoder plans): a query row's result depends only on its q, its
sequence's K/V and its causal length. Every (row, head) runs the same loops, whose order is fixed by
that length alone: scores over positions j < length, each a float32 dot over head_dim, their peak
kept on the way; exp; float64 sum; output accumulated in float32 over j in order, divided by the
sum. The work is cut into tasks (a sequence's block of up to ROWS query rows, one KV head) whose
query vectors (its rows times the `group` query heads of the KV head) share each K/V row read from
the pool. The task cut and the split across cores (parallel_for over runs of tasks) change no row's
arithmetic.

A soft-cap (softcap > 0, Gemma 2) maps each scaled score s to softcap * tanh(s / softcap) in float32
right where it is computed, before the peak is taken; ALiBi slopes (one per query head) then add
slope * (k - p) in float32, k the key's position and p the query's. A sliding window (window > 0) starts a task's
loops at the run holding its first row's first key: scores before a vector's own window become
-inf (weight exactly 0), so the extra leading terms of a row, which depend on the task cut, add
exact zeros and change nothing.

Float32 arithmetic, as onnxruntime's float32 attention: dots, exp and output sums in float32 take
twice the SIMD lanes of float64 and a shorter exp polynomial; only the softmax denominator (one sum
per query vector) stays float64. Against the float64 kernel this replaces (the peak now also kept
while scoring: a max pass that keeps NaN does not vectorize), SmolLM2's attention per step is 1.5x
faster for prefill (256 tokens, or a 16-token chunk over 2000 cached positions) and 1.2-1.35x for
decode steps, which stream the pools from memory. Results differ from the float64 NumPy path by
float32 rounding of the scores, which grows with their size: ~5e-7 absolute for unit-scale q, K, V
at head_dim 64 (tests: rtol 2e-6, atol 1e-6), ~1e-5 where scores reach ~300 (a float32 ulp there is
3e-5). The weights carry under 3e-7 relative error of their own (exp within 2 ulp); exp is 0 below
-87, where float32's normal range ends (what it drops is under 2e-38 of the peak's weight 1).

The K and V rows are read from the pools in place: float32 copies of each run of STRIDE rows (what
float64 widening needed) were no faster. `attend` returns None where it does not handle the case
(compiled kernels off, other dtypes, tables or lengths the NumPy path must judge); the caller then
takes the NumPy path.
"""

from __future__ import annotations

import math

import numpy as np

from ..chain_gemm import spread_or_alone
from ..gemm_impls import PARALLEL_MIN_BYTES
from ..jit import jit, prange
from .common import parallel_for

ROWS = 16  # query rows per task: their q and outputs (x group) stay in L1, the scores in L2
_PARTS = 8  # runs of tasks handed to parallel_for: enough to even out prefill chunks of unequal cost
_SEQ, _KV_HEAD, _ROW, _NUM_ROWS, _LENGTH = range(5)  # the columns of a task
SPREAD_MIN_BYTES = 3 << 17  # K/V read from which a step's tasks go to numba's threads (measured: below, one thread is as fast)
STRIDE = 4  # positions whose dot products (and value rows) one loop pass takes together

# float32 exp for the softmax, vectorizable (a libm call per element is not): exp(r) * 2^n with
# n = round(x / ln 2), r = x - n ln 2 in two parts (ln 2's high part has 9 bits: n * _LN2_HI is
# exact), |r| <= ln 2 / 2, exp(r) by its Taylor series to r^7 (5e-9 relative, under float32's 6e-8)
_LOG2E, _LN2_HI, _LN2_LO = 1.4426950408889634, 0.693359375, -2.1219444005469057e-4
_EXP_TAYLOR = tuple(1.0 / math.factorial(k) for k in range(7, -1, -1))  # r^7 ... r^0
_EXP_LOW = -87.0  # below, exp(x) leaves float32's normal range: 0 (at most 2e-38 of the peak's 1)


@jit
def _attend_tasks(q, k_pool, v_pool, tables, tasks, scale, softcap, window, slopes, sinks, group, out):
    """out [T, N * H] rows of the tasks from q [T, N * H] (float32); k_pool, v_pool [blocks, kvN,
    block_size, H] float32; tables [seqs, max_blocks] int64; slopes [N] float32 (ALiBi) or [0]; sinks
    [N] float32 (each query head's sink logit: in the peak and the denominator, no value) or [0];
    tasks [n, 5] int64 rows (sequence, KV
    head, first query row, number of rows, causal length of the first row: row i sees positions
    < length + i). False (some rows unwritten) when a table names a block outside the pool.

    Positions go in aligned runs of STRIDE, whose K (then V) rows all the task's query vectors
    read from the pool. A query vector takes a run in the STRIDE-wide loop when it sees the whole
    run, else position by position: which loop computes a score or value term depends on the
    position and the vector's causal length only."""
    num_blocks, kv_heads, block_size, head_dim = k_pool.shape
    f32 = np.float32
    longest, widest = 1, 1
    for t in range(tasks.shape[0]):
        longest = max(longest, tasks[t, _LENGTH] + tasks[t, _NUM_ROWS] - 1)
        widest = max(widest, tasks[t, _NUM_ROWS] * group)
    keys, values = k_pool.reshape(-1, head_dim), v_pool.reshape(-1, head_dim)  # rows of the pools
    # the pool row of each position of the task's sequence; a run's positions past the task's last
    # name some row of the pool (pool row 0, or an earlier task's): taken, never used
    where = np.zeros(longest + STRIDE, np.int64)
    q32 = np.empty((widest, head_dim), f32)  # query vector m: row m // group, head m % group of the KV head
    acc = np.empty((widest, head_dim), f32)
    sums = np.empty(widest)  # softmax denominators in float64: one sum per vector, cheap
    peaks = np.empty(widest, f32)  # each vector's highest score so far (NaN aside, see below)
    has_alibi, has_sinks = slopes.shape[0] > 0, sinks.shape[0] > 0
    vector_slopes = np.zeros(widest, f32)  # each vector's ALiBi slope (its query head's)
    scores = np.empty((widest, longest + STRIDE), f32)
    bits = np.empty(longest, np.int32)  # 2^n of exp's range reduction, built from its bits
    powers = bits.view(f32)
    zero, half, scale32, cap32, is_capped = f32(0.0), f32(0.5), f32(scale), f32(softcap), softcap > 0
    hidden = f32(-np.inf)  # a score outside the window
    low, log2e, ln2_hi, ln2_lo = f32(_EXP_LOW), f32(_LOG2E), f32(_LN2_HI), f32(_LN2_LO)
    c7, c6, c5, c4 = f32(_EXP_TAYLOR[0]), f32(_EXP_TAYLOR[1]), f32(_EXP_TAYLOR[2]), f32(_EXP_TAYLOR[3])
    c3, c2, c1, c0 = f32(_EXP_TAYLOR[4]), f32(_EXP_TAYLOR[5]), f32(_EXP_TAYLOR[6]), f32(_EXP_TAYLOR[7])
    bias, shift = np.int32(127), np.int32(23)
    for t in range(tasks.shape[0]):
        seq, kv_head, row0 = tasks[t, _SEQ], tasks[t, _KV_HEAD], tasks[t, _ROW]
        num_rows, length0 = tasks[t, _NUM_ROWS], tasks[t, _LENGTH]
        last = length0 + num_rows - 1  # positions the task reads
        width = num_rows * group
        # with a window, vector m sees positions from length0 + m // group - window on: the loops
        # start at the run of the first row's first key
        start = max(0, length0 - window) // STRIDE * STRIDE if window > 0 else 0
        for b in range((last + block_size - 1) // block_size):
            block = tables[seq, b]
            if block < 0 or block >= num_blocks:
                return False
            first = b * block_size
            for i in range(min(block_size, last - first)):
                where[first + i] = (block * kv_heads + kv_head) * block_size + i
        for m in range(width):
            row, column = row0 + m // group, (kv_head * group + m % group) * head_dim
            for d in range(head_dim):
                q32[m, d] = q[row, column + d]
                acc[m, d] = zero
            peaks[m] = -np.inf
            if has_alibi:
                vector_slopes[m] = slopes[kv_head * group + m % group]
        # scores: vectors from `whole` on see the run [j, j + STRIDE), those from `some` its start
        for j in range(start, last, STRIDE):
            k0, k1, k2, k3 = keys[where[j]], keys[where[j + 1]], keys[where[j + 2]], keys[where[j + 3]]
            whole = min(max(0, j + STRIDE - length0) * group, width)
            some = max(0, j + 1 - length0) * group
            for m in range(whole, width):
                x = q32[m]
                s0 = s1 = s2 = s3 = zero
                for d in range(head_dim):
                    s0 += x[d] * k0[d]
                    s1 += x[d] * k1[d]
                    s2 += x[d] * k2[d]
                    s3 += x[d] * k3[d]
                s0, s1, s2, s3 = s0 * scale32, s1 * scale32, s2 * scale32, s3 * scale32
                if is_capped:
                    s0, s1 = cap32 * np.tanh(s0 / cap32), cap32 * np.tanh(s1 / cap32)
                    s2, s3 = cap32 * np.tanh(s2 / cap32), cap32 * np.tanh(s3 / cap32)
                if has_alibi:  # key j's distance back from the query's own position
                    slope, back = vector_slopes[m], j - (length0 + m // group - 1)
                    s0, s1 = s0 + slope * f32(back), s1 + slope * f32(back + 1)
                    s2, s3 = s2 + slope * f32(back + 2), s3 + slope * f32(back + 3)
                first_seen = length0 + m // group - window  # the vector's first key, with a window
                if window > 0 and j < first_seen:
                    s0 = hidden if j < first_seen else s0
                    s1 = hidden if j + 1 < first_seen else s1
                    s2 = hidden if j + 2 < first_seen else s2
                    s3 = hidden if j + 3 < first_seen else s3
                row_scores = scores[m]
                row_scores[j], row_scores[j + 1], row_scores[j + 2], row_scores[j + 3] = s0, s1, s2, s3
                s0, s2 = max(s0, s1), max(s2, s3)
                s0 = max(s0, s2)
                peaks[m] = max(peaks[m], s0)
            for m in range(some, whole):
                x = q32[m]
                for i in range(length0 + m // group - j):
                    key = keys[where[j + i]]
                    s0 = zero
                    for d in range(head_dim):
                        s0 += x[d] * key[d]
                    s0 *= scale32
                    if is_capped:
                        s0 = cap32 * np.tanh(s0 / cap32)
                    if has_alibi:
                        s0 += vector_slopes[m] * f32(j + i - (length0 + m // group - 1))
                    if window > 0 and j + i < length0 + m // group - window:
                        s0 = hidden
                    scores[m, j + i] = s0
                    peaks[m] = max(peaks[m], s0)
        # softmax numerators (in place) and their sum. The peaks skip NaN scores (a max that keeps
        # NaN does not vectorize, and took 20% of a long prefill chunk on its own), and a NaN may
        # hide a run's other scores from them: a NaN score stays NaN, and makes its row's sum and
        # then the whole row NaN, as NumPy's max would
        for m in range(width):
            length, peak = length0 + m // group, peaks[m]
            if has_sinks:
                peak = max(peak, sinks[kv_head * group + m % group])
            # views that start at `start`, so these loops run from index 0: with a start numba
            # cannot prove nonnegative it wraps negative indexes, and LLVM then leaves the loop
            # scalar (measured: the softmax took a third of the kernel's time, now a sixth)
            row_scores, row_bits, row_powers = scores[m, start:length], bits[start:length], powers[start:length]
            for j in range(length - start):
                x = row_scores[j] - peak
                # within [low, 0] (above 0 only beside a NaN): n stays defined, r keeps a NaN
                clamped = min(x, zero) if x >= low else low
                n = np.floor(clamped * log2e + half)
                r = x - n * ln2_hi - n * ln2_lo
                e = ((((((c7 * r + c6) * r + c5) * r + c4) * r + c3) * r + c2) * r + c1) * r + c0
                row_bits[j] = (np.int32(n) + bias) << shift
                row_scores[j] = zero if x < low else e
            for j in range(length - start):
                row_scores[j] *= row_powers[j]
            # the sum is vectorized, so its grouping follows the index: it starts at the row's own
            # first key (earlier terms are exact zeros), never at the task's `start`, which
            # depends on how the rows were cut into tasks
            own = max(start, length - window) if window > 0 else start
            visible = scores[m, own:length]
            total = 0.0
            for j in range(length - own):
                total += visible[j]
            if has_sinks:  # the sink's own softmax term, after the keys' (their order stays the row's)
                total += np.exp(np.float64(sinks[kv_head * group + m % group]) - np.float64(peak))
            sums[m] = total
        for j in range(start, last, STRIDE):  # value terms, in position order for every vector
            v0, v1, v2, v3 = values[where[j]], values[where[j + 1]], values[where[j + 2]], values[where[j + 3]]
            whole = min(max(0, j + STRIDE - length0) * group, width)
            some = max(0, j + 1 - length0) * group
            for m in range(whole, width):
                y, row_scores = acc[m], scores[m]
                p0, p1, p2, p3 = row_scores[j], row_scores[j + 1], row_scores[j + 2], row_scores[j + 3]
                for d in range(head_dim):
                    a = y[d]
                    a += p0 * v0[d]
                    a += p1 * v1[d]
                    a += p2 * v2[d]
                    a += p3 * v3[d]
                    y[d] = a
            for m in range(some, whole):
                y = acc[m]
                for i in range(length0 + m // group - j):
                    value, p0 = values[where[j + i]], scores[m, j + i]
                    for d in range(head_dim):
                        y[d] += p0 * value[d]
        for m in range(width):
            row, column = row0 + m // group, (kv_head * group + m % group) * head_dim
            for d in range(head_dim):
                out[row, column + d] = np.float32(acc[m, d] / sums[m])
    return True


@jit(calls=(_attend_tasks,))
def _attend_parts(q, k_pool, v_pool, tables, tasks, bounds, scale, softcap, window, slopes, sinks, group, out, ok):
    """_attend_tasks on each run of tasks [bounds[p], bounds[p + 1]) (the parallel build: runs spread
    over numba's threads); ok[p] False where the run's tables name a block outside the pool."""
    for p in prange(bounds.shape[0] - 1):
        ok[p] = _attend_tasks(q, k_pool, v_pool, tables, tasks[bounds[p]:bounds[p + 1]], scale, softcap, window,
                              slopes, sinks, group, out)


@jit
def _plan_tasks(starts, context_lens, num_q_rows, table_width, block_size, kv_heads, group, window):
    """(ok, tasks [n, 5] int64, cost [n]: running total of the tasks' work, positions read): each
    sequence's query rows in blocks of ROWS, times the KV heads. Not ok (the NumPy path judges the
    step) when the rows leave q, a chunk is longer than its context or the table is too short."""
    seqs = context_lens.shape[0]
    count, read = 0, 0
    ok = starts.shape[0] == seqs + 1 and starts[0] >= 0 and starts[seqs] <= num_q_rows
    for s in range(seqs if ok else 0):
        num_new, length = starts[s + 1] - starts[s], context_lens[s]
        if num_new > 0 and (length < num_new or (length + block_size - 1) // block_size > table_width):
            ok = False
        if num_new < 0:
            ok = False
        if num_new > 0:
            count += (num_new + ROWS - 1) // ROWS * kv_heads
            read += length
    tasks = np.empty((count if ok else 0, 5), np.int64)
    cost = np.empty(tasks.shape[0])
    t, total = 0, 0.0
    for s in range(seqs if ok else 0):
        num_new, length = starts[s + 1] - starts[s], context_lens[s]
        for first in range(0, max(num_new, 0), ROWS):
            num_rows = min(ROWS, num_new - first)
            length0 = length - num_new + first + 1
            for kv_head in range(kv_heads):
                tasks[t, _SEQ], tasks[t, _KV_HEAD], tasks[t, _ROW] = s, kv_head, starts[s] + first
                tasks[t, _NUM_ROWS], tasks[t, _LENGTH] = num_rows, length0
                # K/V rows read, then dot products and value terms of each query vector
                span = length0 + num_rows - (max(0, length0 - window) if window > 0 else 0)
                total += span * (4.0 + num_rows * group)
                cost[t] = total
                t += 1
    return ok, tasks, cost, read


@jit
def _write_pools(k_pool, v_pool, k_new, v_new, slots):
    """The step's new K/V rows (k_new, v_new [kvN, T, H]) into the pools at `slots` (one NumPy
    fancy-index assignment per pool costs more, above all with cold caches between a step's
    GEMMs). False, writing nothing, when a slot lies outside the pools (the NumPy path raises)."""
    num_blocks, kv_heads, block_size, head_dim = k_pool.shape
    for t in range(slots.shape[0]):
        if slots[t] < 0 or slots[t] >= num_blocks * block_size:
            return False
    for t in range(slots.shape[0]):
        block, offset = slots[t] // block_size, slots[t] % block_size
        for h in range(kv_heads):
            for d in range(head_dim):
                k_pool[block, h, offset, d] = k_new[h, t, d]
                v_pool[block, h, offset, d] = v_new[h, t, d]
    return True


def write_pools(k_pool, v_pool, k_new, v_new, slots) -> bool:
    """Compiled write of the new K/V [1, kvN, T, H] into float32 pools; False where the caller must
    take the NumPy path (compiled kernels off, other dtypes or shapes, a slot outside the pools)."""
    kernel, f32 = _write_pools.get(), np.float32
    if kernel is None or k_pool.dtype != f32 or v_pool.dtype != f32 or k_new.dtype != f32 or v_new.dtype != f32:
        return False
    if k_pool.ndim != 4 or k_pool.shape != v_pool.shape or not (k_pool.flags.c_contiguous and v_pool.flags.c_contiguous):
        return False
    if k_new.shape != v_new.shape or k_new.ndim != 4 or k_new.shape[0] != 1 or k_new.shape[1] != k_pool.shape[1] \
            or k_new.shape[3] != k_pool.shape[3] or k_new.shape[2] != slots.shape[0]:
        return False
    return bool(kernel(k_pool, v_pool, k_new[0], v_new[0], np.asarray(slots, np.int64)))


@jit
def _part_bounds(cost, parts):
    """Task indices cutting `cost` (running totals) into up to `parts` runs of about equal work,
    empty runs dropped: [0, ..., len(cost)] (NumPy's unique of a searchsorted, in one call)."""
    bounds = np.empty(parts + 1, np.int64)
    bounds[0], count, t = 0, 1, 0
    for p in range(1, parts + 1):
        target = cost[-1] * p / parts
        while t < cost.shape[0] and cost[t] <= target:
            t += 1
        if t > bounds[count - 1]:
            bounds[count] = t
            count += 1
    if bounds[count - 1] < cost.shape[0]:
        bounds[count] = cost.shape[0]
        count += 1
    return bounds[:count]


def attend(q, k_pool, v_pool, tables, starts, context_lens, num_heads: int, scale: float,
           softcap: float = 0.0, window: int = 0, slopes: np.ndarray | None = None,
           sinks: np.ndarray | None = None) -> np.ndarray | None:
    """[T, N * H] float32 attention of q [..., T, N * H] over the pools (the new tokens' K/V already
    written), or None where the NumPy path must run."""
    kernel, plan = _attend_tasks.get(), _plan_tasks.get()
    f32 = np.float32
    if kernel is None or plan is None or q.dtype != f32 or k_pool.dtype != f32 or v_pool.dtype != f32:
        return None
    if k_pool.shape != v_pool.shape or k_pool.ndim != 4 or not (k_pool.flags.c_contiguous and v_pool.flags.c_contiguous):
        return None  # the pools are written in place: a copy would not do
    kv_heads, block_size, head_dim = k_pool.shape[1:]
    if num_heads % kv_heads or q.shape[-1] != num_heads * head_dim or tables.ndim != 2 or starts.ndim != 1:
        return None
    slopes = np.zeros(0, f32) if slopes is None else np.ascontiguousarray(slopes, f32)
    sinks = np.zeros(0, f32) if sinks is None else np.ascontiguousarray(sinks, f32)
    if tables.shape[0] != context_lens.size or slopes.size not in (0, num_heads) or sinks.size not in (0, num_heads):
        return None
    group = num_heads // kv_heads
    q2 = np.ascontiguousarray(q.reshape(-1, q.shape[-1]))
    ok, tasks, cost, read = plan(np.asarray(starts, np.int64), np.asarray(context_lens, np.int64).reshape(-1),
                                 q2.shape[0], tables.shape[1], block_size, kv_heads, group, int(window))
    if not ok:
        return None  # malformed steps (rows past the context, tables too short, ...) are the NumPy path's to judge
    out = np.empty(q2.shape, f32)
    tables = np.ascontiguousarray(tables, np.int64)
    scale, softcap, window = float(scale), float(softcap), int(window)
    read *= kv_heads * head_dim * 2 * k_pool.itemsize
    spread = _attend_parts.get_parallel() if len(tasks) >= 2 else None
    # one thread below these sizes: numba's threads (when there) from SPREAD_MIN_BYTES, else the
    # helper thread from PARALLEL_MIN_BYTES (its hand-off costs a GIL round trip)
    if len(tasks) < 2 or read < (PARALLEL_MIN_BYTES if spread is None else SPREAD_MIN_BYTES):
        return out if kernel(q2, k_pool, v_pool, tables, tasks, scale, softcap, window, slopes, sinks, group, out) else None
    # runs of consecutive tasks of about equal cost: a prefill block costs far more than a decode row
    bounds = _part_bounds.get()(cost, _PARTS)
    if spread is not None:  # numba's threads: no GIL round trip (runtime/jit.py)
        ok = np.zeros(len(bounds) - 1, np.bool_)

        def alone() -> None:
            ok[:] = kernel(q2, k_pool, v_pool, tables, tasks, scale, softcap, window, slopes, sinks, group, out)

        # the GEMMs' backoff: while numba's other thread starts late (its core busy with another
        # process) a step's attention runs on this thread (one machine loaded to 10: 82 against
        # 294 us a layer at four sequences); tasks never change a row's arithmetic
        spread_or_alone(lambda: spread(q2, k_pool, v_pool, tables, tasks, bounds, scale, softcap, window, slopes, sinks,
                                       group, out, ok), alone)
        return out if ok.all() else None
    failed = []

    def run(part: int) -> None:
        if not kernel(q2, k_pool, v_pool, tables, tasks[bounds[part]:bounds[part + 1]], scale, softcap, window, slopes,
                      sinks, group, out):
            failed.append(part)

    parallel_for(len(bounds) - 1, run, read)
    return None if failed else out
