"""Compiled CPU kernels through numba, optional: every kernel that uses one keeps its NumPy path.

Why: on the small tensors of real models (a 16-token BERT, a 3x24 depthwise plane) NumPy's cost is
its calls, 1-3 us each on a shared core, and a normalization or a depthwise convolution takes ten
of them or a loop over taps. One compiled loop does the whole op in one call.

Rules for kernels written with `jit`:
- compiled lazily, on the first call of each argument-type signature, and cached on disk by numba
  (`NUMBA_CACHE_DIR`, default `$XDG_CACHE_HOME/infc/numba`): later processes load the machine code
  in milliseconds. That cache is machine-local compiled code, like `__pycache__`; plans never hold
  it and loading a plan never reads it.
- kernels release the GIL (`nogil`) and the caller splits the work with `gemm_impls.parallel_for`,
  which already knows when a second core pays off. Its hand-off costs a GIL round trip (20-40 us
  on these machines), so kernels called hundreds of times per decode step also come as a
  `parallel=True` build (`Kernel.get_parallel()`): `prange` loops spread over numba's threads,
  which never touch the GIL. Only under a thread-safe threading layer (OpenMP or TBB): numba's
  default workqueue layer aborts the process when two threads launch parallel loops at once, so
  without one `get_parallel()` is None and the caller keeps parallel_for. Kernels name the other
  kernels they call in `calls=` (bound to their compiled builds when compiled).
- results of a row never depend on how many rows there are (decoder plans rely on batch
  invariance): reductions run along the row, in an order fixed by its length alone.
- `INFC_JIT=0` turns every compiled kernel off (`enabled()`); tests run both paths.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import types
from pathlib import Path
from typing import Callable

_LOCK = threading.Lock()
_NUMBA: list = []  # [module or None] once probed
_OFF = [os.environ.get("INFC_JIT", "1").strip().lower() in ("0", "false", "off", "no")]

# reassociation lets LLVM vectorize reductions; no 'nnan'/'ninf': NaN and Inf keep their meaning
FASTMATH = {"reassoc", "contract"}
# multiply-adds fuse but keep their order: kernels that must reproduce another library's sums bit
# for bit (runtime/chain_gemm.py)
IN_ORDER = {"contract"}


# a kernel's `prange` loops: plain range until compiled; the compiled builds see numba.prange (a
# range in the serial build, spread over threads in the parallel one)
prange = range
_LAYER: list = []  # [(a thread-safe threading layer is there, the probing process's id)] once probed
_THREAD = threading.local()  # `counted`: this thread set the thread count of parallel builds
GOMP_SPIN = 2000  # pauses an OpenMP thread spins after a parallel loop before it sleeps (~50-100 us)
PARALLEL_THREADS = 2  # threads of a parallel build's loops: their items are the two cores' blocks


def _numba():
    if not _NUMBA:
        with _LOCK:
            if not _NUMBA:
                cache_root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
                os.environ.setdefault("NUMBA_CACHE_DIR", str(Path(cache_root) / "infc" / "numba"))
                try:
                    import numba  # noqa: PLC0415 - optional, and 0.2 s to import: only when a kernel is used
                except Exception:  # noqa: BLE001 - missing or broken: the NumPy paths serve
                    numba = None
                _NUMBA.append(numba)
    return _NUMBA[0]


def enabled() -> bool:
    """Compiled kernels are on and numba imports."""
    return not _OFF[0] and _numba() is not None


@contextlib.contextmanager
def switched_off(flag: list):
    """Within the block flag[0] is True (a kernel family's off switch), as it was after it."""
    previous = flag[0]
    flag[0] = True
    try:
        yield
    finally:
        flag[0] = previous


def disabled():
    """Within the block every kernel takes its NumPy path (tests compare the two)."""
    return switched_off(_OFF)


def threadsafe_layer() -> bool:
    """numba's parallel loops can run here from any thread: OpenMP or TBB loads (chosen for the
    process unless the user picked a layer; a user's workqueue choice turns parallel builds off).
    Never in a process forked from the one that probed: GNU OpenMP's threads do not survive a
    fork, and numba ends a child that launches a parallel loop after its parent did."""
    if not _LAYER:
        _numba()  # before the lock: it takes the lock itself
        with _LOCK:
            if not _LAYER:
                _LAYER.append((_probe_layer(), os.getpid()))
    usable, pid = _LAYER[0]
    return usable and pid == os.getpid()


def _probe_layer() -> bool:
    numba = _numba()
    if numba is None:
        return False
    chosen = str(numba.config.THREADING_LAYER).lower()
    if chosen not in ("default", "threadsafe", "omp", "tbb"):
        return False
    modules = {"omp": ("omppool",), "tbb": ("tbbpool",)}.get(chosen, ("omppool", "tbbpool"))
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        # GNU OpenMP's threads spin 300,000 pauses (milliseconds here) after each parallel loop,
        # holding the core parallel_for's helper needs next (a 128-token prefill's GEMMs: 1.3-1.7x
        # slower, measured); this covers the gaps between a decode step's GEMMs. Read when
        # libgomp loads, which importing omppool does
        os.environ["GOMP_SPINCOUNT"] = str(GOMP_SPIN)
    for module in modules:
        try:
            __import__(f"numba.np.ufunc.{module}")
        except Exception:  # noqa: BLE001 - not built or its library missing: try the next
            continue
        if chosen == "default":
            numba.config.THREADING_LAYER = "threadsafe"
        return True
    return False


class Kernel:
    """A Python function compiled on first use: `kernel.get()` is the compiled dispatcher, or None
    when compiled kernels are off (the caller then takes its NumPy path); `kernel.get_parallel()`
    the build whose `prange` loops run on numba's threads, or None (see the module docstring)."""

    __slots__ = ("fn", "fastmath", "calls", "intrinsics", "_compiled", "_parallel")

    def __init__(self, fn: Callable, fastmath: set[str] = FASTMATH, calls: tuple = (),
                 intrinsics: Callable[[], dict] | None = None):
        self.fn = fn
        self.fastmath = fastmath
        self.calls = calls
        self.intrinsics = intrinsics
        self._compiled = None
        self._parallel = None

    def get(self):
        if _OFF[0]:
            return None
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = self._compile(parallel=False)
        return compiled

    def get_parallel(self):
        if _OFF[0] or not threadsafe_layer():
            return None
        compiled = self._parallel
        if compiled is None:
            compiled = self._parallel = self._compile(parallel=True)
        if compiled is not None and not getattr(_THREAD, "counted", False):
            numba = _numba()  # a setting of the launching thread; numba's default is every core
            numba.set_num_threads(min(PARALLEL_THREADS, numba.config.NUMBA_NUM_THREADS))
            _THREAD.counted = True
        return compiled

    def _compile(self, parallel: bool):
        numba = _numba()
        if numba is None:
            return None
        called = {kernel.fn.__name__: kernel.get() for kernel in self.calls}
        if any(dispatcher is None for dispatcher in called.values()):
            return None
        if self.intrinsics is not None:  # numba intrinsics (LLVM IR the kernel inlines), built once numba imports
            called.update(self.intrinsics())
        fn = self.fn
        if called or parallel or "prange" in fn.__code__.co_names:  # the same code, seeing compiled names
            bound = types.FunctionType(fn.__code__, {**fn.__globals__, **called, "prange": numba.prange},
                                       fn.__name__, fn.__defaults__, fn.__closure__)
            # numba's disk cache is keyed by name, not by build flags: the parallel build has its own;
            # and it is stale only when the kernel's own file changes, not a file of a kernel it
            # calls (compiled into it): the callees' code is part of the name
            bound.__qualname__ = fn.__qualname__ + ("_parallel" if parallel else "") + _callees_digest(self.calls)
            bound.__module__, bound.__doc__ = fn.__module__, fn.__doc__
            fn = bound
        with _LOCK:
            return numba.njit(fn, cache=True, nogil=True, fastmath=self.fastmath, parallel=parallel,
                              boundscheck=False, error_model="numpy")


def _code_bytes(code: types.CodeType) -> bytes:
    """What a code object computes: its bytecode and constants, nested functions included."""
    parts = [code.co_code, repr(code.co_names).encode()]
    for const in code.co_consts:
        parts.append(_code_bytes(const) if isinstance(const, types.CodeType) else repr(const).encode())
    return b"\0".join(parts)


def _callees_digest(calls: tuple) -> str:
    """A short digest of the code of the kernels `calls` names, and of theirs ("" for none)."""
    if not calls:
        return ""
    digest, seen, todo = hashlib.sha256(), set(), list(calls)
    while todo:
        kernel = todo.pop()
        if id(kernel) in seen:
            continue
        seen.add(id(kernel))
        digest.update(kernel.fn.__qualname__.encode() + b"\0" + _code_bytes(kernel.fn.__code__))
        todo.extend(kernel.calls)
    return "_" + digest.hexdigest()[:12]


def jit(fn: Callable | None = None, *, fastmath: set[str] = FASTMATH, calls: tuple = (),
        intrinsics: Callable[[], dict] | None = None):
    """Decorator, bare or with `fastmath=` / `calls=` / `intrinsics=` (a function returning the
    names the kernel calls that are numba intrinsics, called when it compiles): the function becomes
    a `Kernel` (see the module docstring for the rules)."""
    if fn is None:
        return lambda f: Kernel(f, fastmath, calls, intrinsics)
    return Kernel(fn, fastmath, calls, intrinsics)
