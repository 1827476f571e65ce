"""Float32 GEMMs whose rows do not depend on the number of rows, checked on this machine's BLAS.

Decoder plans need batch invariance: a sequence's logits must not change with what else is in the
step. BLAS does not promise it. OpenBLAS, for one, takes a GEMV path for one row and "small
matrix" kernels while M*N*K is below a threshold, and their sums round differently from its
blocked GEMM. The blocked GEMM itself is row-invariant: each output element is the same chain of
fused multiply-adds over K whatever M is.

So `row_invariant_product(a, w, rows_from)` runs one fixed recipe: BLAS on one thread, the columns
of `w` split into blocks chosen from (K, N) alone (two cores share them), and fewer rows than
`rows_from` padded with zero rows up to it. `min_rows(w)` finds that threshold for the weight's
shape by probing the recipe on seeded random rows against a reference product of R rows: every row
count from 1 to 16, then steps of 1.5x up to R, each compared bit for bit with the reference's
first rows; the regime change after the last disagreeing probe is then pinned by bisection
(thresholds are on M*N*K, so agreement is monotone in M). R is 100 rows, or more for small weights
so that the reference itself reaches M*N*K = 2^26 (64x OpenBLAS's small-matrix bound), up to 4096.
Row counts above R are not probed: they stay on the blocked path the reference is on.

A shape whose threshold would pad every call to more than 16 rows and 8M multiply-adds gets None:
the caller runs it in float64 instead (kernels/batch_invariant.py). The probe runs once per weight
shape and process: a few hundred rows of the GEMM (0.4 s for a 576 x 49152 LM head).
"""

from __future__ import annotations

import threading

import numpy as np

from .gemm_impls import blas_threads, parallel_for

DENSE_PROBES = tuple(range(1, 17))  # the GEMV and smallest-kernel thresholds live here
GROWTH = 1.5  # then probes every 1.5x up to the reference
REFERENCE_ROWS = 100
MAX_REFERENCE_ROWS = 4096
PROBE_MACS = 1 << 26  # small weights get a reference this large, past any small-matrix threshold
PAD_MAX_MACS = 1 << 23  # padding that would cost more than this per call: float64 instead
SPLIT_MIN_ELEMENTS = 1 << 18  # weights from 1 MB are split in column blocks between two cores
BLOCK_ALIGN = 64  # column block edges on whole vector tiles

_MIN_ROWS: dict[tuple, int | None] = {}
_LOCK = threading.Lock()


def column_blocks(k: int, n: int) -> tuple[tuple[int, int], ...]:
    """The column blocks of a [k, n] weight: a function of the shape only, never of M."""
    if k * n < SPLIT_MIN_ELEMENTS or n < 2 * BLOCK_ALIGN:
        return ((0, n),)
    middle = -(-n // 2 // BLOCK_ALIGN) * BLOCK_ALIGN
    return ((0, middle), (middle, n))


def _product(a: np.ndarray, w: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The fixed recipe: one BLAS thread per column block, blocks shared with the helper thread."""
    blocks = column_blocks(*w.shape)
    with blas_threads(1):
        if len(blocks) == 1:
            np.matmul(a, w, out=out)
        else:
            parallel_for(len(blocks), lambda i: np.matmul(a, w[:, blocks[i][0]:blocks[i][1]],
                                                          out=out[:, blocks[i][0]:blocks[i][1]]))
    return out


def reference_rows(k: int, n: int) -> int:
    return int(min(MAX_REFERENCE_ROWS, max(REFERENCE_ROWS, -(-PROBE_MACS // max(1, k * n)))))


def probe_rows(reference: int) -> list[int]:
    rows, m = list(DENSE_PROBES), float(DENSE_PROBES[-1])
    while (m := m * GROWTH) < reference:
        rows.append(int(m))
    return [r for r in rows if r < reference]


def _probe(w: np.ndarray) -> int | None:
    k, n = w.shape
    count = reference_rows(k, n)
    x = np.random.default_rng(0).standard_normal((count, k)).astype(np.float32)
    reference = _product(x, w, np.empty((count, n), np.float32))

    def agrees(m: int) -> bool:
        return np.array_equal(_product(x[:m], w, np.empty((m, n), np.float32)), reference[:m])

    probes = probe_rows(count)
    disagree = [m for m in probes if not agrees(m)]
    if not disagree:
        return 1
    low = disagree[-1]
    high = next((m for m in probes if m > low), count)  # agrees (or is the reference)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if agrees(middle) else (middle, high)
    if high > DENSE_PROBES[-1] and high * k * n > PAD_MAX_MACS:
        return None
    return high


def min_rows(w: np.ndarray) -> int | None:
    """Rows from which `w`'s shape is row-invariant on this BLAS (pad fewer up to it), or None."""
    key = (w.shape, w.strides)
    if key not in _MIN_ROWS:
        with _LOCK:
            if key not in _MIN_ROWS:
                _MIN_ROWS[key] = _probe(w)
    return _MIN_ROWS[key]


def verified_shapes() -> dict[tuple[int, int], int | None]:
    """(K, N) -> min_rows for every weight shape probed so far (None: float64 fallback)."""
    return {key[0]: value for key, value in _MIN_ROWS.items()}


def gemm_invariance_report() -> dict[str, str]:
    """For `infc run --json`: each weight shape probed so far, "KxN", and how it runs."""
    return {f"{k}x{n}": (f"float32, from {rows} rows" if rows else "float64 (the probe found no usable threshold)")
            for (k, n), rows in sorted(verified_shapes().items())}


def row_invariant_product(a: np.ndarray, w: np.ndarray, rows_from: int) -> np.ndarray:
    """a [M, K] @ w [K, N] in float32 by the fixed recipe, M padded up to `rows_from` (min_rows)."""
    m = a.shape[0]
    if m >= rows_from:
        return _product(np.ascontiguousarray(a), w, np.empty((m, w.shape[1]), np.float32))
    padded = np.zeros((rows_from, a.shape[1]), np.float32)
    padded[:m] = a
    return _product(padded, w, np.empty((rows_from, w.shape[1]), np.float32))[:m]
