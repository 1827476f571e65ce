"""Compiled CPU kernels through numba, optional: every kernel that uses one keeps its NumPy path.

Why: on the small tensors of real models (a 16-token BERT, a 3x24 depthwise plane) NumPy's cost is
its calls, 1-3 us each on a shared core, and a normalization or a depthwise convolution takes ten
of them or a loop over taps. One compiled loop does the whole op in one call.

Rules for kernels written with `jit`:
- compiled lazily, on the first call of each argument-type signature, and cached on disk by numba
  (`NUMBA_CACHE_DIR`, default `$XDG_CACHE_HOME/infc/numba`): later processes load the machine code
  in milliseconds. That cache is machine-local compiled code, like `__pycache__`; plans never hold
  it and loading a plan never reads it.
- no numba threading layer (`parallel=True`): its default layer aborts the process when two threads
  launch parallel loops at once. Kernels release the GIL (`nogil`) and the caller splits the work
  with `gemm_impls.parallel_for`, which already knows when a second core pays off.
- results of a row never depend on how many rows there are (decoder plans rely on batch
  invariance): reductions run along the row, in an order fixed by its length alone.
- `INFC_JIT=0` turns every compiled kernel off (`enabled()`); tests run both paths.
"""

from __future__ import annotations

import contextlib
import os
import threading
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
def disabled():
    """Within the block every kernel takes its NumPy path (tests compare the two)."""
    previous = _OFF[0]
    _OFF[0] = True
    try:
        yield
    finally:
        _OFF[0] = previous


class Kernel:
    """A Python function compiled on first use: `kernel.get()` is the compiled dispatcher, or None
    when compiled kernels are off (the caller then takes its NumPy path)."""

    __slots__ = ("fn", "fastmath", "_compiled")

    def __init__(self, fn: Callable, fastmath: set[str] = FASTMATH):
        self.fn = fn
        self.fastmath = fastmath
        self._compiled = None

    def get(self):
        if _OFF[0]:
            return None
        compiled = self._compiled
        if compiled is None:
            numba = _numba()
            if numba is None:
                return None
            with _LOCK:
                if self._compiled is None:
                    self._compiled = numba.njit(self.fn, cache=True, nogil=True, fastmath=self.fastmath,
                                                boundscheck=False, error_model="numpy")
            compiled = self._compiled
        return compiled


def jit(fn: Callable | None = None, *, fastmath: set[str] = FASTMATH):
    """Decorator, bare or with `fastmath=`: the function becomes a `Kernel` (see the module
    docstring for the rules)."""
    if fn is None:
        return lambda f: Kernel(f, fastmath)
    return Kernel(fn, fastmath)
