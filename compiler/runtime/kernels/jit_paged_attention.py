"""Compiled (numba, see runtime/jit.py) attention of infc.PagedAttention for float32 plans: K and V
are read straight from the pools through the block tables (no gathered copies), for decode rows and
prefill chunks alike, where the NumPy path gathers float64 copies of every sequence's context.

Batch and chunk invariance (decoder plans): a query row's result depends only on its q, its
sequence's K/V and its causal length. Every (row, head) runs the same loops, whose order is fixed by
that length alone: scores over positions j < length, each a float64 dot over head_dim; peak; exp;
float64 sum; output accumulated over j in order, divided by the sum. The work is cut into tasks
(a sequence's block of up to ROWS query rows, one KV head) whose query vectors (its rows times the
`group` query heads of the KV head) share each K/V row read from the pool and widened to float64.
The task cut and the split across cores (parallel_for over runs of tasks) change no row's
arithmetic.

Widening a few rows at a time into a small buffer, not the task's whole context up front: a float64
copy of the context per task made decode steps (which stream the pools from memory) 1.7x slower,
and widening in the dot loops for every query vector made prefill chunks 40% slower.

Float64 arithmetic on the float32 pools, as the NumPy path: results agree with it to float32
rounding. `attend` returns None where it does not handle the case (compiled kernels off, other
dtypes, tables or lengths the NumPy path must judge); the caller then takes the NumPy path.
"""

from __future__ import annotations

import math

import numpy as np

from ..gemm_impls import PARALLEL_MIN_BYTES
from ..jit import jit
from .common import parallel_for

ROWS = 16  # query rows per task: their float64 q and outputs (x group) stay in L1, the scores in L2
_PARTS = 8  # runs of tasks handed to parallel_for: enough to even out prefill chunks of unequal cost
_SEQ, _KV_HEAD, _ROW, _NUM_ROWS, _LENGTH = range(5)  # the columns of a task


# exp for the softmax, vectorizable (a libm call per element is not): exp(r) * 2^n with
# n = round(x / ln 2), |r| <= ln 2 / 2, exp(r) by its Taylor series to r^12 (2e-16 relative)
_LOG2E, _LN2_HI, _LN2_LO = 1.4426950408889634, 0.6931471803691238, 1.9082149292705877e-10
_EXP_TAYLOR = tuple(1.0 / math.factorial(k) for k in range(12, -1, -1))  # r^12 ... r^0
_EXP_LOW = -708.0  # below, exp(x) is under float64's normal range: 0 (exp's subnormals add nothing)
STRIDE = 4  # positions whose dot products (and value rows) one loop pass takes together


@jit
def _attend_tasks(q, k_pool, v_pool, tables, tasks, scale, group, out):
    """out [T, N * H] rows of the tasks from q [T, N * H] (float32); k_pool, v_pool [blocks, kvN,
    block_size, H] float32; tables [seqs, max_blocks] int64; tasks [n, 5] int64 rows (sequence, KV
    head, first query row, number of rows, causal length of the first row: row i sees positions
    < length + i). False (some rows unwritten) when a table names a block outside the pool.

    Positions go in aligned runs of STRIDE, each run's K (then V) rows widened once into `staged`
    for all the task's query vectors. A query vector takes a run in the STRIDE-wide loop when it
    sees the whole run, else position by position: which loop computes a score or value term
    depends on the position and the vector's causal length only."""
    num_blocks, kv_heads, block_size, head_dim = k_pool.shape
    longest, widest = 1, 1
    for t in range(tasks.shape[0]):
        longest = max(longest, tasks[t, _LENGTH] + tasks[t, _NUM_ROWS] - 1)
        widest = max(widest, tasks[t, _NUM_ROWS] * group)
    keys, values = k_pool.reshape(-1, head_dim), v_pool.reshape(-1, head_dim)  # rows of the pools
    where = np.empty(longest, np.int64)  # the pool row of each position of the task's sequence
    q64 = np.empty((widest, head_dim))  # query vector m: row m // group, head m % group of the KV head
    acc = np.empty((widest, head_dim))
    sums = np.empty(widest)
    scores = np.empty((widest, longest + STRIDE))
    staged = np.empty((STRIDE, head_dim))
    bits = np.empty(longest, np.int64)  # 2^n of exp's range reduction, built from its bits
    powers = bits.view(np.float64)
    low, log2e, ln2_hi, ln2_lo = _EXP_LOW, _LOG2E, _LN2_HI, _LN2_LO
    c12, c11, c10, c9, c8, c7, c6 = _EXP_TAYLOR[:7]
    c5, c4, c3, c2, c1, c0 = _EXP_TAYLOR[7:]
    for t in range(tasks.shape[0]):
        seq, kv_head, row0 = tasks[t, _SEQ], tasks[t, _KV_HEAD], tasks[t, _ROW]
        num_rows, length0 = tasks[t, _NUM_ROWS], tasks[t, _LENGTH]
        last = length0 + num_rows - 1  # positions the task reads
        width = num_rows * group
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
                q64[m, d] = q[row, column + d]
                acc[m, d] = 0.0
        # scores: vectors from `whole` on see the run [j, j + STRIDE), those from `some` its start
        for j in range(0, last, STRIDE):
            for i in range(min(STRIDE, last - j)):
                key = keys[where[j + i]]
                for d in range(head_dim):
                    staged[i, d] = key[d]
            k0, k1, k2, k3 = staged[0], staged[1], staged[2], staged[3]
            whole = min(max(0, j + STRIDE - length0) * group, width)
            some = max(0, j + 1 - length0) * group
            for m in range(whole, width):
                x = q64[m]
                s0 = s1 = s2 = s3 = 0.0
                for d in range(head_dim):
                    s0 += x[d] * k0[d]
                    s1 += x[d] * k1[d]
                    s2 += x[d] * k2[d]
                    s3 += x[d] * k3[d]
                row_scores = scores[m]
                row_scores[j], row_scores[j + 1] = s0 * scale, s1 * scale
                row_scores[j + 2], row_scores[j + 3] = s2 * scale, s3 * scale
            for m in range(some, whole):
                x = q64[m]
                for i in range(length0 + m // group - j):
                    key = staged[i]
                    s0 = 0.0
                    for d in range(head_dim):
                        s0 += x[d] * key[d]
                    scores[m, j + i] = s0 * scale
        for m in range(width):  # softmax numerators (in place) and their sum
            length, row_scores = length0 + m // group, scores[m]
            peak = row_scores[0]
            for j in range(1, length):
                if row_scores[j] > peak or row_scores[j] != row_scores[j]:  # NaN wins, as in NumPy
                    peak = row_scores[j]
            for j in range(length):
                x = row_scores[j] - peak
                clamped = x if x >= low else low  # noqa: FURB136 - NaN -> low: n stays defined, r keeps the NaN
                n = math.floor(clamped * log2e + 0.5)
                r = x - n * ln2_hi - n * ln2_lo
                e = ((((((((((((c12 * r + c11) * r + c10) * r + c9) * r + c8) * r + c7) * r + c6) * r + c5) * r
                            + c4) * r + c3) * r + c2) * r + c1) * r + c0)
                bits[j] = np.int64(n + 1023.0) << np.int64(52)
                row_scores[j] = 0.0 if x < low else e
            total = 0.0
            for j in range(length):
                row_scores[j] *= powers[j]
                total += row_scores[j]
            sums[m] = total
        for j in range(0, last, STRIDE):  # value terms, in position order for every vector
            for i in range(min(STRIDE, last - j)):
                value = values[where[j + i]]
                for d in range(head_dim):
                    staged[i, d] = value[d]
            v0, v1, v2, v3 = staged[0], staged[1], staged[2], staged[3]
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
                    value, p0 = staged[i], scores[m, j + i]
                    for d in range(head_dim):
                        y[d] += p0 * value[d]
        for m in range(width):
            row, column = row0 + m // group, (kv_head * group + m % group) * head_dim
            for d in range(head_dim):
                out[row, column + d] = np.float32(acc[m, d] / sums[m])
    return True


@jit
def _plan_tasks(starts, context_lens, num_q_rows, table_width, block_size, kv_heads, group):
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
                total += (length0 + num_rows) * (4.0 + num_rows * group)
                cost[t] = total
                t += 1
    return ok, tasks, cost, read


def attend(q, k_pool, v_pool, tables, starts, context_lens, num_heads: int, scale: float) -> np.ndarray | None:
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
    if tables.shape[0] != context_lens.size:
        return None
    group = num_heads // kv_heads
    q2 = np.ascontiguousarray(q.reshape(-1, q.shape[-1]))
    ok, tasks, cost, read = plan(np.asarray(starts, np.int64), np.asarray(context_lens, np.int64).reshape(-1),
                                 q2.shape[0], tables.shape[1], block_size, kv_heads, group)
    if not ok:
        return None  # malformed steps (rows past the context, tables too short, ...) are the NumPy path's to judge
    out = np.empty(q2.shape, f32)
    tables = np.ascontiguousarray(tables, np.int64)
    scale = float(scale)
    read *= kv_heads * head_dim * 2 * k_pool.itemsize
    if read < PARALLEL_MIN_BYTES or len(tasks) < 2:  # not worth a hand-off to the helper thread
        return out if kernel(q2, k_pool, v_pool, tables, tasks, scale, group, out) else None
    # runs of consecutive tasks of about equal cost: a prefill block costs far more than a decode row
    bounds = np.unique(np.searchsorted(cost, cost[-1] * np.arange(_PARTS + 1) / _PARTS, side="right"))
    bounds[0] = 0
    failed = []

    def run(part: int) -> None:
        if not kernel(q2, k_pool, v_pool, tables, tasks[bounds[part]:bounds[part + 1]], scale, group, out):
            failed.append(part)

    parallel_for(len(bounds) - 1, run, read)
    return None if failed else out
