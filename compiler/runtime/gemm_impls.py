"""GEMM implementations y = a @ w that the build's autotuner picks between, looked up by name.

A plan's GEMM step carries the winning config: `impl` names a function in IMPLS, its params are
keyword arguments, and the build's prepack stored the weight arrays the function reads:

    matmul, dot           w          (K, N)   the weight as given (matmul with no params is the vendor)
    matmul_wt             w_t        (N, K)   transposed copy: BLAS reads it as op(B) = B^T
    matmul_wt_swapped     w_t        (N, K)   computes (w_t @ a^T)^T: for skinny M a row-major gemv
    matmul_blocked        w_blocked  (K*N,)   column panels of `block` columns, each contiguous (K, b)

Every function takes a (..., K) activation (leading dims are flattened into M, so NumPy runs one
BLAS call instead of one per batch item), returns a C-contiguous (..., N) array in a's dtype, and
writes into `out` (shape (..., N)) when given. `threads` caps the BLAS threads during the call: on
a few cores threading overhead loses to one thread for small problems, and one thread is much less
hurt when another process competes for the cores.

NumPy only (threadpoolctl when installed, for `threads`); nothing here imports the compiler half.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, Mapping

import numpy as np

Packed = Mapping[str, np.ndarray]


@functools.cache
def _blas_libraries() -> tuple[Any, ...]:
    # Looked up once per process: which BLAS libraries are loaded is a fact of the process, and
    # scanning for them costs ~100 µs, more than a small GEMM.
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return ()
    return tuple(ThreadpoolController().select(user_api="blas").lib_controllers)


@contextlib.contextmanager
def blas_threads(num_threads: int | None) -> Iterator[None]:
    """Caps the BLAS thread count for the block (no-op for None). Not safe across Python threads."""
    libraries = _blas_libraries() if num_threads else ()
    previous = [library.num_threads for library in libraries]
    for library in libraries:
        library.set_num_threads(num_threads)
    try:
        yield
    finally:
        for library, count in zip(libraries, previous):
            library.set_num_threads(count)


def _rows(a: np.ndarray, k: int) -> np.ndarray:
    if a.shape[-1] != k:
        raise ValueError(f"gemm: activation has {a.shape[-1]} columns, the weight {k} rows")
    return a.reshape(-1, k)


def _out_rows(out: np.ndarray | None, a: np.ndarray, n: int) -> np.ndarray:
    if out is None:
        return np.empty((int(np.prod(a.shape[:-1], dtype=np.int64)), n), dtype=a.dtype)
    if out.shape != (*a.shape[:-1], n) or not out.flags.c_contiguous:
        raise ValueError(f"gemm: out must be C-contiguous {(*a.shape[:-1], n)}, got {out.shape}")
    return out.reshape(-1, n)


def _shaped(y: np.ndarray, a: np.ndarray) -> np.ndarray:
    return y.reshape(*a.shape[:-1], y.shape[-1])


def matmul(a: np.ndarray, packed: Packed, out: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    w = packed["w"]
    a2 = _rows(a, w.shape[0])
    y = _out_rows(out, a, w.shape[1])
    with blas_threads(threads):
        np.matmul(a2, w, out=y)
    return _shaped(y, a)


def dot(a: np.ndarray, packed: Packed, out: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    w = packed["w"]
    a2 = np.ascontiguousarray(_rows(a, w.shape[0]))  # np.dot's out= needs C-contiguous operands to stay on BLAS
    y = _out_rows(out, a, w.shape[1])
    with blas_threads(threads):
        np.dot(a2, w, out=y)
    return _shaped(y, a)


def matmul_wt(a: np.ndarray, packed: Packed, out: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    w_t = packed["w_t"]
    a2 = _rows(a, w_t.shape[1])
    y = _out_rows(out, a, w_t.shape[0])
    with blas_threads(threads):
        np.matmul(a2, w_t.T, out=y)
    return _shaped(y, a)


def matmul_wt_swapped(a: np.ndarray, packed: Packed, out: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    w_t = packed["w_t"]
    a2 = _rows(a, w_t.shape[1])
    y = _out_rows(out, a, w_t.shape[0])
    with blas_threads(threads):
        y_t = np.matmul(w_t, a2.T)  # (N, M); BLAS cannot write y^T in place (its last axis is not unit-stride)
    if y_t.shape[1] == 1:
        y.reshape(-1)[...] = y_t.reshape(-1)  # M == 1: y_t already has y's memory order
    else:
        y[...] = y_t.T
    return _shaped(y, a)


def matmul_blocked(a: np.ndarray, packed: Packed, out: np.ndarray | None = None, block: int = 512,
                   threads: int | None = None) -> np.ndarray:
    w_blocked = packed["w_blocked"]
    k = a.shape[-1]
    n = w_blocked.size // k
    if w_blocked.size != n * k:
        raise ValueError(f"gemm: blocked weight of {w_blocked.size} values is not a multiple of K={k}")
    a2 = _rows(a, k)
    y = _out_rows(out, a, n)
    with blas_threads(threads):
        for start in range(0, n, block):
            width = min(block, n - start)
            panel = w_blocked[k * start: k * (start + width)].reshape(k, width)
            np.matmul(a2, panel, out=y[:, start: start + width])  # a unit-stride column slice: BLAS writes it with ldc = N
    return _shaped(y, a)


IMPLS: dict[str, Callable[..., np.ndarray]] = {
    "matmul": matmul,
    "dot": dot,
    "matmul_wt": matmul_wt,
    "matmul_wt_swapped": matmul_wt_swapped,
    "matmul_blocked": matmul_blocked,
}


def run_gemm(impl: str, a: np.ndarray, packed: Packed, params: Mapping[str, Any], out: np.ndarray | None = None) -> np.ndarray:
    function = IMPLS.get(impl)
    if function is None:
        raise ValueError(f"unknown GEMM impl '{impl}' (known: {', '.join(sorted(IMPLS))})")
    return function(a, packed, out=out, **params)
