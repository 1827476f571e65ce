"""GEMM implementations y = a @ w that the build's autotuner picks between, looked up by name.

A plan's GEMM step carries the winning config: `impl` names a function in IMPLS, its params are
keyword arguments, and the build's prepack stored the weight arrays the function reads:

    matmul, dot           w          (K, N)   the weight as given (matmul with no params is the vendor)
    matmul_wt             w_t        (N, K)   transposed copy: BLAS reads it as op(B) = B^T
    matmul_wt_swapped     w_t        (N, K)   computes (w_t @ a^T)^T: for skinny M a row-major gemv
    matmul_blocked        w_blocked  (K*N,)   column panels of `block` columns, each contiguous (K, b)
    matmul_bf16           w, w_pairs          the weight, and its bf16 k pairs (bf16_gemm.pack_pairs) that
                                              AMX-BF16 / AVX512-BF16 tiles read: for activations and weights
                                              holding bf16 values (a bf16 plan's), sums in float32

Every function takes a (..., K) activation (leading dims are flattened into M, so NumPy runs one
BLAS call instead of one per batch item), returns a C-contiguous (..., N) array in a's dtype, and
writes into `out` (shape (..., N)) when given. `threads` caps the BLAS threads during the call: on
a few cores threading overhead loses to one thread for small problems, and one thread is much less
hurt when another process competes for the cores.

Two cores without BLAS threads: `threads` None means one BLAS thread, and GEMMs from SPLIT_MIN_MACS
on are split in row or column blocks that this thread and one helper thread claim one at a time
(`product_into`, `parallel_for`; the kernels share convolution blocks and elementwise chunks the
same way). A helper that does not get a core (another process has it) costs at most the block it
claimed, where OpenBLAS's own threads were measured stalling small GEMMs 30-fold.

NumPy only (threadpoolctl when installed, for `threads`); nothing here imports the compiler half.
"""

from __future__ import annotations

import functools
import os
import queue
import threading
import time
from typing import Any, Callable, Mapping

import numpy as np

from . import amx_gemm, bf16_gemm

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


@functools.cache
def _thread_controls() -> tuple[tuple[Callable[[], int], Callable[[int], Any]], ...]:
    """(get, set) thread-count functions per BLAS library: the library's own C entry points where
    threadpoolctl exposes them (a ctypes call, ~0.2 µs), else threadpoolctl's Python wrappers."""
    controls = []
    for library in _blas_libraries():
        prefix = getattr(library, "prefix", "") or ""
        symbol = getattr(library, "_get_symbol", None)
        getter = setter = None
        if symbol is not None and getattr(library, "threading_layer", None) != "openmp" and "openblas" in prefix:
            getter, setter = symbol("openblas_get_num_threads"), symbol("openblas_set_num_threads")
        if getter is None or setter is None:
            getter, setter = (lambda lib=library: lib.num_threads), library.set_num_threads
        controls.append((getter, setter))
    return tuple(controls)


class blas_threads:  # noqa: N801 - used like a function: `with blas_threads(n):`
    """Caps the BLAS thread count for the block (no-op for None). Not safe across Python threads.
    A class, not a generator context manager: it runs around every small GEMM."""

    __slots__ = ("num_threads", "previous", "outer")
    _pinned: int | None = None  # the count an enclosing block set (nested blocks asking the same are free)

    def __init__(self, num_threads: int | None):
        self.num_threads = num_threads
        self.previous = None
        self.outer = None

    # An executor enters one around every run (1-2 us of Python a run on a 0.1 ms model): the
    # loops below keep it to the ctypes calls that change the count, with no temporaries but `previous`.
    def __enter__(self) -> None:
        num_threads = self.num_threads
        if num_threads and num_threads != blas_threads._pinned:
            previous = []
            for get, set_threads in _thread_controls():
                count = get()
                if count != num_threads:
                    set_threads(num_threads)
                previous.append(count)
            self.previous = previous
            self.outer, blas_threads._pinned = blas_threads._pinned, num_threads

    def __exit__(self, *exc) -> None:
        previous = self.previous
        if previous is not None:
            num_threads, position = self.num_threads, 0
            for _, set_threads in _thread_controls():
                count = previous[position]
                if count != num_threads:
                    set_threads(count)
                position += 1
            self.previous = None
            blas_threads._pinned = self.outer


# ---------------------------------------------------------------------------------------------
# Sharing a loop with a second core. NumPy and BLAS release the GIL, so a helper thread can run
# independent chunks (column blocks of a GEMM, channel blocks of a convolution, chunks of an
# elementwise chain) while the calling thread runs others. Items are claimed one at a time, so
# when the helper is not scheduled (another process has the core) the caller simply does them all
# and never waits for it: at worst the loop runs at one-thread speed, unlike a BLAS thread pool,
# whose hand-offs stall for whole scheduler ticks on a busy machine.

HELPERS = 1 if (os.cpu_count() or 1) > 1 else 0


class _Loop:
    __slots__ = ("fn", "count", "next", "active", "closed", "lock", "idle", "error")

    def __init__(self, fn, count):
        self.fn, self.count, self.next, self.active, self.closed = fn, count, 0, 0, False
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.error = None

    def claim(self) -> int:
        with self.lock:
            if self.closed or self.next >= self.count:
                return -1
            index, self.next = self.next, self.next + 1
            self.active += 1
            return index

    def done(self) -> None:
        with self.lock:
            self.active -= 1
            if self.active == 0:
                self.idle.notify_all()

    def work(self) -> None:
        while True:
            index = self.claim()
            if index < 0:
                return
            try:
                self.fn(index)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                self.error = exc
                with self.lock:
                    self.closed = True
            finally:
                self.done()


class _Helper:
    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="infc-helper", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        _IN_LOOP.active = True  # loops started from inside a shared item run inline
        while True:
            loop = self.jobs.get()
            loop.work()


_HELPER: _Helper | None = None
_HELPER_LOCK = threading.Lock()
_IN_LOOP = threading.local()


PARALLEL_MIN_BYTES = 1 << 18  # below this much data a loop is not worth the hand-off (~20 us)


def parallel_for(count: int, fn: Callable[[int], None], nbytes: int | None = None) -> None:
    """fn(0), ..., fn(count - 1) in any order, shared with a helper thread when there is a spare
    core and the loop touches at least PARALLEL_MIN_BYTES (`nbytes`, when given). `fn` must only
    write disjoint outputs and use per-thread scratch (the `pooled` buffers are per thread)."""
    global _HELPER
    if count < 2 or not HELPERS or getattr(_IN_LOOP, "active", False) or (
            nbytes is not None and nbytes < PARALLEL_MIN_BYTES):
        for index in range(count):
            fn(index)
        return
    if _HELPER is None:
        with _HELPER_LOCK:
            if _HELPER is None:
                _HELPER = _Helper()
    if _BACKOFF.skip:
        _BACKOFF.skip -= 1
        for index in range(count):
            fn(index)
        return
    loop = _Loop(fn, count)
    started = time.perf_counter()
    _HELPER.jobs.put(loop)
    _IN_LOOP.active = True
    try:
        loop.work()
    finally:
        _IN_LOOP.active = False
        mine_done = time.perf_counter()
        with loop.lock:
            loop.closed = True  # a helper that wakes up late finds nothing left
            while loop.active:
                loop.idle.wait()
        _BACKOFF.record(started, mine_done, time.perf_counter())
    if loop.error is not None:
        raise loop.error


class Backoff:
    """When the caller keeps waiting for an item the helper started late (its core is busy with
    another process), loops stay on the caller for the next 2, 4, ... 64 calls, then try again.
    (chain_gemm.over_column_blocks keeps one for numba's threads.)"""

    def __init__(self):
        self.skip, self.level = 0, 0

    def record(self, started: float, mine_done: float, finished: float) -> None:
        waited = finished - mine_done
        if waited > 2e-4 and waited > 0.25 * (finished - started):
            self.level = min(self.level + 1, 6)
            self.skip = 1 << self.level
        else:
            self.level = 0


_BACKOFF = Backoff()


def _rows(a: np.ndarray, k: int) -> np.ndarray:
    if a.shape[-1] != k:
        raise ValueError(f"gemm: activation has {a.shape[-1]} columns, the weight {k} rows")
    return a if a.ndim == 2 else a.reshape(-1, k)


def _out_rows(out: np.ndarray | None, a: np.ndarray, n: int) -> np.ndarray:
    if out is None:
        return np.empty((a.size // a.shape[-1] if a.shape[-1] else _lead(a), n), dtype=a.dtype)
    if out.shape != (*a.shape[:-1], n) or not out.flags.c_contiguous:
        raise ValueError(f"gemm: out must be C-contiguous {(*a.shape[:-1], n)}, got {out.shape}")
    return out if out.ndim == 2 else out.reshape(-1, n)


def _lead(a: np.ndarray) -> int:
    m = 1
    for d in a.shape[:-1]:
        m *= d
    return m


def _shaped(y: np.ndarray, a: np.ndarray) -> np.ndarray:
    return y if a.ndim == 2 else y.reshape(*a.shape[:-1], y.shape[-1])


OPENBLAS_SERIAL_MACS = 1 << 18  # OpenBLAS runs smaller GEMMs on the calling thread anyway
SPLIT_MIN_MACS = 1 << 22  # larger GEMMs are split between this thread and the helper, one BLAS thread each


def product_into(a2: np.ndarray, b: np.ndarray, out: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    """out = a2 @ b for 2-D operands (out may be a strided view with unit-stride rows).

    With `threads` None, GEMMs OpenBLAS would thread run on one BLAS thread, and from
    SPLIT_MIN_MACS on, in row or column blocks shared with the helper thread (parallel_for): the
    same use of two cores as BLAS threads on an idle machine, without their stalls on a busy one."""
    m, k = a2.shape
    n = b.shape[1]
    macs = m * n * k
    if macs < OPENBLAS_SERIAL_MACS:  # one thread whatever `threads` says
        return np.matmul(a2, b) if out is None else np.matmul(a2, b, out=out)
    if out is None:
        out = np.empty((m, n), dtype=np.result_type(a2.dtype, b.dtype))
    with blas_threads(threads or 1):
        if threads or macs < SPLIT_MIN_MACS or not HELPERS:
            np.matmul(a2, b, out=out)
            return out
        parts = int(min(4, macs // (SPLIT_MIN_MACS // 2)))
        if m >= n:  # row blocks: contiguous slices of a2 and out
            step = -(-m // parts)
            parallel_for(-(-m // step), lambda i: np.matmul(a2[i * step:(i + 1) * step], b, out=out[i * step:(i + 1) * step]))
        else:  # column blocks: BLAS reads and writes them with the full row strides
            step = -(-n // parts)
            parallel_for(-(-n // step), lambda i: np.matmul(a2, b[:, i * step:(i + 1) * step],
                                                            out=out[:, i * step:(i + 1) * step]))
    return out


def matmul(a: np.ndarray, packed: Packed, out: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    w = packed["w"]
    a2 = _rows(a, w.shape[0])
    y = product_into(a2, w, None if out is None else _out_rows(out, a, w.shape[1]), threads)
    return _shaped(y, a)


def dot(a: np.ndarray, packed: Packed, out: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    w = packed["w"]
    a2 = _rows(a, w.shape[0])
    if not a2.flags.c_contiguous:
        a2 = np.ascontiguousarray(a2)  # np.dot's out= needs C-contiguous operands to stay on BLAS
    m, k = a2.shape
    if m * k * w.shape[1] >= OPENBLAS_SERIAL_MACS:  # BLAS threads or blocks: the shared path
        return _shaped(product_into(a2, w, None if out is None else _out_rows(out, a, w.shape[1]), threads), a)
    if out is None:
        return _shaped(np.dot(a2, w), a)
    y = _out_rows(out, a, w.shape[1])
    np.dot(a2, w, out=y)
    return _shaped(y, a)


def matmul_wt(a: np.ndarray, packed: Packed, out: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    w_t = packed["w_t"]
    a2 = _rows(a, w_t.shape[1])
    y = product_into(a2, w_t.T, None if out is None else _out_rows(out, a, w_t.shape[0]), threads)
    return _shaped(y, a)


def matmul_wt_swapped(a: np.ndarray, packed: Packed, out: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    w_t = packed["w_t"]
    a2 = _rows(a, w_t.shape[1])
    y = _out_rows(out, a, w_t.shape[0])
    with blas_threads(threads or (1 if a2.size * w_t.shape[0] >= OPENBLAS_SERIAL_MACS else None)):
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
    starts = range(0, n, block)

    def panel(i):
        start = starts[i]
        width = min(block, n - start)
        weights = w_blocked[k * start: k * (start + width)].reshape(k, width)
        np.matmul(a2, weights, out=y[:, start: start + width])  # a unit-stride column slice: BLAS writes it with ldc = N

    with blas_threads(threads or 1):
        if threads or a2.shape[0] * n * k < SPLIT_MIN_MACS:
            for i in range(len(starts)):
                panel(i)
        else:
            parallel_for(len(starts), panel)
    return _shaped(y, a)


BF16_KERNELS = {"amx": amx_gemm.amx_product, "avx512": bf16_gemm.bf16_product}


def matmul_bf16(a: np.ndarray, packed: Packed, out: np.ndarray | None = None, kernel: str = "amx",
                threads: int | None = None) -> np.ndarray:
    """a @ w with a rounded to bf16 and bf16 products summed in float32, on `kernel`'s tiles; where
    the CPU lacks them (a plan built on another machine) the float32 product on the weight, which
    holds the same bf16 values: the same sums up to their order. `threads` 1: one core (the two
    threads of one physical core share its AMX unit: splitting measured slower there)."""
    w, pairs = packed["w"], packed["w_pairs"]
    a2 = _rows(a, w.shape[0])
    y = _out_rows(out, a, w.shape[1])
    if BF16_KERNELS[kernel](a2, pairs, w.shape[1], y, split=threads is None) is None:
        product_into(a2, w, y, threads)
    return _shaped(y, a)


IMPLS: dict[str, Callable[..., np.ndarray]] = {
    "matmul": matmul,
    "dot": dot,
    "matmul_wt": matmul_wt,
    "matmul_wt_swapped": matmul_wt_swapped,
    "matmul_blocked": matmul_blocked,
    "matmul_bf16": matmul_bf16,
}
BF16_IMPLS = frozenset({"matmul_bf16"})  # read bf16 values: a may only be a bf16 value's float32


def run_gemm(impl: str, a: np.ndarray, packed: Packed, params: Mapping[str, Any], out: np.ndarray | None = None) -> np.ndarray:
    function = IMPLS.get(impl)
    if function is None:
        raise ValueError(f"unknown GEMM impl '{impl}' (known: {', '.join(sorted(IMPLS))})")
    return function(a, packed, out=out, **params)
