"""Float32 GEMMs whose rows do not depend on the number of rows, checked on this machine's BLAS.

Decoder plans need batch invariance: a sequence's logits must not change with what else is in the
step. BLAS does not promise it. OpenBLAS, for one, takes a GEMV path for one row and "small
matrix" kernels while M*N*K is below a threshold, and their sums round differently from its
blocked GEMM. The blocked GEMM itself is row-invariant: each output element is the same chain of
fused multiply-adds over K whatever M is.

So `row_invariant_product(a, w, rows_from)` runs one fixed recipe: BLAS on one thread, the columns
of `w` split into blocks chosen from (K, N) alone (two cores share them), and fewer rows than
`rows_from` padded with zero rows up to it. `min_rows(w)` finds that threshold for the weight's
shape by probing the recipe on seeded random rows and a random weight of its layout against a reference product of R rows: every row
count from 1 to 16, then steps of 1.5x up to R, each compared bit for bit with the reference's
first rows; the regime change after the last disagreeing probe is then pinned by bisection
(thresholds are on M*N*K, so agreement is monotone in M). R is 100 rows, or more for small weights
so that the reference itself reaches M*N*K = 2^26 (64x OpenBLAS's small-matrix bound), up to 4096.
Row counts above R are not probed: they stay on the blocked path the reference is on.

A shape whose threshold would pad every call to more than 16 rows and 8M multiply-adds gets None,
unless the chain kernel (below) serves the rows under it: the caller then runs every row count in an
order of its own (`own_order_product`: the chain kernel's sums, register-blocked on packed panels by
runtime/panel_gemm.py), or in float64 without compiled kernels (kernels/batch_invariant.py). The probe runs once per weight
shape and process: a few hundred rows of the GEMM (0.4 s for a 576 x 49152 LM head).

Decode steps have few rows, and padding them into the blocked GEMM costs 2-5x a GEMV. So the probe
also looks for the blocked GEMM's K blocking (runtime/chain_gemm.py reproduces its sums without
packing the weight): the candidate cuts of K are tried on one reference row, the likeliest first and
the cut that matched the last shape before all, and the one that matches is checked on CHAIN_ROWS
rows. Up to CHAIN_ROWS rows, and any count under the threshold, then run on that kernel,
bit-identical to the recipe; shapes where no cut matched keep the recipe. Matched here: OpenBLAS's
SkylakeX SGEMM. Not matched: its Haswell kernels (their rows differ with M at any size, so those
shapes run in float64) and Sandybridge's (no fused multiply-add).
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from . import jit
from .chain_gemm import candidate_rules, chain_product, k_blocks
from .code_chain_gemm import codes_product
from .gemm_impls import blas_threads, parallel_for
from .panel_gemm import has_wide_vectors, panel_product

DENSE_PROBES = tuple(range(1, 17))  # the GEMV and smallest-kernel thresholds live here
GROWTH = 1.5  # then probes every 1.5x up to the reference
REFERENCE_ROWS = 100
MAX_REFERENCE_ROWS = 4096
PROBE_MACS = 1 << 26  # small weights get a reference this large, past any small-matrix threshold
PAD_MAX_MACS = 1 << 23  # padding that would cost more than this per call: float64 instead
SPLIT_MIN_ELEMENTS = 1 << 18  # weights from 1 MB are split in column blocks between two cores
BLOCK_ALIGN = 64  # column block edges on whole vector tiles
CHAIN_ROWS = 8  # up to this many rows run on the chain kernel (measured: faster than the padded GEMM)
CHAIN_RULES_TRIED = 48  # distinct cuts of K tried at least, before the chain kernel is given up
OWN_DEPTH = 448  # the cut of K where no BLAS recipe serves: OpenBLAS SkylakeX's, any would do
CHAIN_PROBE_MACS = 1 << 29  # and more while their one-row trials stay within this many multiply-adds

_MIN_ROWS: dict[tuple, int | None] = {}
_CHAIN_EDGES: dict[tuple, np.ndarray | None] = {}  # same keys: the K cut the chain kernel reproduces
_LAST_RULE: list = [None]  # (depth, unroll) that matched last: other shapes try it first
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


def _chain_edges(w: np.ndarray, x: np.ndarray, reference: np.ndarray) -> np.ndarray | None:
    """The cut of K under which the chain kernel gives the blocked GEMM's rows bit for bit, or None."""
    rows = min(CHAIN_ROWS, len(x))
    tried = max(CHAIN_RULES_TRIED, CHAIN_PROBE_MACS // w.size)
    for rule, edges in candidate_rules(w.shape[0], _LAST_RULE[0])[:tried]:
        edges = np.asarray(edges, np.int64)
        one = _chained(x[:1], w, edges)
        if one is None:
            return None  # compiled kernels are off
        if np.array_equal(one, reference[:1]):
            several = _chained(x[:rows], w, edges)
            if several is not None and np.array_equal(several, reference[:rows]):
                _LAST_RULE[0] = rule
                return edges
            return None
    return None


def _probe_weight(w: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random weight laid out as `w`: the result holds for every weight of the shape and layout
    (the key), so a zero or integer weight, whose sums come out equal in any order, must not decide it."""
    if w.flags.c_contiguous or w.flags.f_contiguous:
        random = rng.standard_normal(w.shape, dtype=np.float32)
        return random if w.flags.c_contiguous else np.asfortranarray(random)
    return w  # another layout: BLAS reads its strides, which a copy would not keep


def _probe(w: np.ndarray) -> tuple[int | None, np.ndarray | None]:
    """(rows from which the recipe is row-invariant, or None; the chain kernel's cut of K, or None).
    A threshold too costly to pad up to is usable when the chain kernel covers the rows below it."""
    k, n = w.shape
    count = reference_rows(k, n)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((count, k)).astype(np.float32)
    w = _probe_weight(w, rng)
    reference = _product(x, w, np.empty((count, n), np.float32))
    threshold = _threshold(w, x, reference)
    if threshold >= count or not _position_free(w, x, reference, threshold):
        # no smaller row count agreed (nothing says larger ones would), or a row's sums depend on
        # where it sits among the rows: a sequence's rows sit anywhere in a batch
        return None, None
    edges = _chain_edges(w, x, reference)
    if edges is None and threshold > DENSE_PROBES[-1] and threshold * k * n > PAD_MAX_MACS:
        return None, None
    return threshold, edges


def _threshold(w: np.ndarray, x: np.ndarray, reference: np.ndarray) -> int:
    """The fewest rows from which the recipe's rows equal the reference's (searched as above)."""
    n = w.shape[1]

    def agrees(m: int) -> bool:
        return np.array_equal(_product(x[:m], w, np.empty((m, n), np.float32)), reference[:m])

    probes = probe_rows(len(x))
    disagree = [m for m in probes if not agrees(m)]
    if not disagree:
        return 1
    low = disagree[-1]
    high = next((m for m in probes if m > low), len(x))  # agrees (or is the reference)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if agrees(middle) else (middle, high)
    return high


SHIFTS = (1, 3, 7, 13, 37)  # row offsets tried: odd, past a register tile, past a 32-row block


def _position_free(w: np.ndarray, x: np.ndarray, reference: np.ndarray, threshold: int) -> bool:
    """Rows taken from further down the reference's batch, `threshold` of them at a time (the fewest
    the recipe runs), get the reference's bits for those rows. The probes above compare prefixes only,
    where every row keeps its place; OpenBLAS's Zen / Haswell SGEMM on an AVX2-only EPYC agreed there
    from 4,080 rows of a 32 x 64 weight, yet a row 39 rows down came out 7e-7 off (qwen2's q/k/v:
    a sequence's logits changed with what was batched before it)."""
    n = w.shape[1]
    for shift in SHIFTS:
        if shift + threshold > len(x):
            break
        rows = x[shift:shift + threshold]
        if not np.array_equal(_product(rows, w, np.empty((threshold, n), np.float32)), reference[shift:shift + threshold]):
            return False
    return True


def min_rows(w: np.ndarray) -> int | None:
    """Rows from which `w`'s shape is row-invariant on this BLAS (pad fewer up to it), or None."""
    key = (w.shape, w.strides)
    if key not in _MIN_ROWS:
        with _LOCK:
            if key not in _MIN_ROWS:
                _MIN_ROWS[key], _CHAIN_EDGES[key] = _probe(w)
    return _MIN_ROWS[key]


def verified_shapes() -> dict[tuple[int, int], int | None]:
    """(K, N) -> min_rows for every weight shape probed so far (None: float64 fallback)."""
    return {key[0]: value for key, value in _MIN_ROWS.items()}


def gemm_invariance_report() -> dict[str, str]:
    """For `infc run --json`: each weight shape probed so far, "KxN", and how it runs."""
    chained = {key[0] for key, edges in _CHAIN_EDGES.items() if edges is not None}

    def how(shape, rows):
        if not rows:
            return ("float32 in infc's own order for every row count, on packed weight panels (this BLAS's rows change with M)"
                    if jit.enabled() else "float64 (the probe found no usable threshold)")
        wide = " (its sums on wide panels: this CPU has 512-bit vectors)" if has_wide_vectors() else ""
        chain = f"; 1-{max(CHAIN_ROWS, rows - 1)} rows on the chain kernel{wide}" if shape in chained else ""
        return f"float32, from {rows} rows{chain}"

    return {f"{k}x{n}": how((k, n), rows) for (k, n), rows in sorted(verified_shapes().items())}


def own_order_product(a: np.ndarray, w: np.ndarray, panels: np.ndarray | None = None) -> np.ndarray | None:
    """a [M, K] @ w [K, N] in float32 with a fixed cut of K, for every M: row invariant by
    construction, for shapes the BLAS recipe cannot serve (min_rows None: OpenBLAS's Haswell
    kernels, whose rows differ with M at any size). On w's `panel_gemm.pack_panels` when given (the
    register-blocked kernel: about the BLAS's speed on prefill rows), else on the chain kernel
    (the same sums, bit for bit). None when compiled kernels are off: the caller then runs float64
    (a process that turns them off midway mixes the two)."""
    edges = own_edges(w.shape[0])
    if panels is not None:
        out = panel_product(a, panels, w.shape[1], edges)
        if out is not None:
            return out
    return _chained(a, w, edges)


@functools.lru_cache(maxsize=512)
def own_edges(k: int) -> np.ndarray:
    """Where the own order cuts K (a function of K alone; one read-only array per K: decode steps
    ask for it on every GEMM)."""
    edges = np.asarray(k_blocks(k, OWN_DEPTH, 1), np.int64)
    edges.flags.writeable = False
    return edges


def _chained(a: np.ndarray, w: np.ndarray, edges: np.ndarray) -> np.ndarray | None:
    """a @ w on the chain kernel with K cut at `edges`, columns split as the recipe splits them."""
    return chain_product(np.ascontiguousarray(a), w, edges, column_blocks(*w.shape),
                         np.empty((a.shape[0], w.shape[1]), np.float32))


def row_invariant_product(a: np.ndarray, w: np.ndarray, rows_from: int) -> np.ndarray:
    """a [M, K] @ w [K, N] in float32 by the fixed recipe, M padded up to `rows_from` (min_rows);
    few rows, or fewer than `rows_from`, on the chain kernel where the probe matched it."""
    m = a.shape[0]
    if m <= CHAIN_ROWS or m < rows_from:
        edges = _CHAIN_EDGES.get((w.shape, w.strides))
        out = None if edges is None else _chained(a, w, edges)
        if out is not None:
            return out
    if m >= rows_from:
        return _product(np.ascontiguousarray(a), w, np.empty((m, w.shape[1]), np.float32))
    padded = np.zeros((rows_from, a.shape[1]), np.float32)
    padded[:m] = a
    return _product(padded, w, np.empty((rows_from, w.shape[1]), np.float32))[:m]


def decode_edges(w: np.ndarray, m: int, rows_from: int | None) -> np.ndarray | None:
    """The cut of K under which m rows of `w` get, from any kernel summing in the chain kernel's
    order (its codes, wide panels), the bits the float32 path gives them (infc's own order, or the
    chain kernel's reproduction of the BLAS recipe's rows), or None where the BLAS serves m rows (or
    the probe found no cut)."""
    if rows_from is None:
        return own_edges(w.shape[0])
    if m <= CHAIN_ROWS or m < rows_from:
        return _CHAIN_EDGES.get((w.shape, w.strides))
    return None


def codes_rows_product(a: np.ndarray, w: np.ndarray, codes, rows_from: int | None) -> np.ndarray | None:
    """The rows `row_invariant_product` (or, with rows_from None, `own_order_product`) would run on
    the chain kernel, computed from `w`'s codes instead (runtime/code_chain_gemm.py: the same sums,
    bit for bit, from a quarter of the bytes); None for the rows the BLAS serves, or when the probe
    found no cut of K. `codes`: (codes [K, N], scale, zero [ceil(K / group), N], group)."""
    edges = decode_edges(w, a.shape[0], rows_from)
    if edges is None:
        return None
    values, scale, zero, group = codes
    return codes_product(a, values, scale, zero, group, edges, column_blocks(*w.shape))
