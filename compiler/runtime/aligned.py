"""Arrays whose rows tile loads read whole cache lines of: 64-byte aligned, large ones on 2 MB pages.

Why: an AMX tile row is 64 bytes. NumPy aligns its arrays to 16 bytes, so a tile row of an array
starting 32 bytes into a line straddled two lines, and every tile load read twice the lines: one
3x3 convolution's tile products (64 channels at 56 x 56, amx_taps.py) ran 0.37 ms from a weight at
such an address and 0.23 ms from a 64-byte aligned one on a Sapphire Rapids core. Large scratch
buffers are also put on huge pages where the kernel grants them (Linux transparent huge pages set
to `madvise`, as these machines are: only ranges asked with madvise(MADV_HUGEPAGE), 2 MB aligned):
a tile's 16 rows a few KB apart each sat on its own 4 KB page (pointwise products of 256 channels
at 56 x 56: 0.28 -> 0.11 ms with both). Where madvise is missing or refused the pages are ordinary.
"""

from __future__ import annotations

import ctypes
import functools
import math
import sys

import numpy as np

LINE = 64
HUGE_PAGE = 2 << 20
HUGE_MIN_BYTES = 1 << 18  # smaller arrays stay on ordinary pages (a huge page is 2 MB of memory once touched)
_MADV_HUGEPAGE = 14


@functools.cache
def _madvise():
    if sys.platform != "linux":
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    call.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return call


def empty(shape, dtype, huge: bool = False) -> np.ndarray:
    """An uninitialized C-ordered array starting on a cache line; `huge`: a scratch buffer that
    goes on huge pages when it is large (HUGE_MIN_BYTES) and the kernel grants them."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = np.dtype(dtype)
    nbytes = max(math.prod(shape), 1) * dtype.itemsize
    madvise = _madvise() if huge and nbytes >= HUGE_MIN_BYTES else None
    align = HUGE_PAGE if madvise is not None else LINE
    span = -(-nbytes // align) * align
    raw = np.empty(span + align, np.uint8)  # untouched pages past the aligned span cost no memory
    start = -raw.ctypes.data % align
    if madvise is not None:
        madvise(raw.ctypes.data + start, span, _MADV_HUGEPAGE)  # a refusal leaves ordinary pages: nothing to do
    return raw[start:start + nbytes].view(dtype)[:math.prod(shape)].reshape(shape)


def copy(a: np.ndarray) -> np.ndarray:
    """a's values in a new aligned C-ordered array."""
    out = empty(a.shape, a.dtype)
    out[...] = a
    return out
