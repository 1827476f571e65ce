"""Launching a plan's row kernels (compiler/codegen/templates/rows.cuh): softmax over the last axis
(MultiHeadAttention's scaled, causal-banded scores in the same pass) and the LayerNorm / RMSNorm /
SkipLayerNorm family, one block per row. As array ops each is 5-10 launches and as many passes over
memory; here it reads and writes each row once.

`functions` maps an entry to fn(grid, block, args) with CuPy's RawKernel convention: a Function of the
plan's cubin on a GPU, the CPU emulator's codegen.emulate.Function in CI. Callers check `may_*` first
and keep their array path for everything else (other dtypes, broadcast operands, other axes).
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

import numpy as np

SOFTMAX, NORM = "infc_softmax_rows", "infc_norm_rows"
# (C type, name) in launch order: the template's signatures (the emulator and the launches below use them)
ROW_ARGS = {
    SOFTMAX: [("const float*", "x"), ("float*", "y"), ("long long", "rows"), ("int", "T"), ("float", "scale"),
              ("int", "causal_len"), ("float", "filler")],
    NORM: [("const float*", "x"), ("const float*", "skip"), ("const float*", "bias"), ("const float*", "gamma"),
           ("const float*", "beta"), ("float*", "y"), ("float*", "total"), ("float*", "mean_out"),
           ("float*", "inv_std_out"), ("long long", "rows"), ("int", "K"), ("float", "eps"), ("int", "flags")],
}
BLOCK = {SOFTMAX: 128, NORM: 256}  # SOFTMAX_BLOCK, NORM_BLOCK in the template
NORM_FLAGS = {"skip": 1, "bias": 2, "beta": 4, "center": 8, "total": 16, "stats": 32}
MAX_GRID = 1 << 20  # blocks; the kernels stride over rows past it
INT_MAX = 2**31 - 1


def _grid(rows: int) -> tuple[int]:
    return (max(1, min(rows, MAX_GRID)),)


class RowKernels:
    def __init__(self, functions: Mapping[str, Callable]):
        self.functions = dict(functions)
        self.launches = 0

    def may_softmax(self, x) -> bool:
        return SOFTMAX in self.functions and x.dtype == np.float32 and 0 < x.shape[-1] <= INT_MAX

    def softmax(self, x, xp, *, scale: float = 1.0, causal_len: int = 0, filler: float = 0.0, in_place: bool = False):
        """softmax over the last axis of float32 x, as contiguous rows: a new array, or x's contiguous self
        overwritten (in_place: for scores nothing else reads)."""
        x = xp.ascontiguousarray(x)
        y = x if in_place else xp.empty_like(x)
        rows = x.size // x.shape[-1]
        if rows:
            self.functions[SOFTMAX](_grid(rows), (BLOCK[SOFTMAX],),
                                    [x, y, np.int64(rows), np.int32(x.shape[-1]), np.float32(scale),
                                     np.int32(causal_len), np.float32(filler)])
            self.launches += 1
        return y

    def may_norm(self, x, first_axis: int, *operands, skip=None) -> bool:
        """x float32 normalized over its axes from `first_axis`, every operand (gamma, beta, bias) one value
        per normalized element, skip (if any) x's own shape."""
        if NORM not in self.functions or x.dtype != np.float32 or not 0 <= first_axis < x.ndim:
            return False
        width = math.prod(x.shape[first_axis:])
        return (0 < width <= INT_MAX and operands[0] is not None
                and all(o is None or (o.dtype == np.float32 and o.size == width) for o in operands)
                and (skip is None or (skip.dtype == np.float32 and skip.shape == x.shape)))

    def norm(self, x, first_axis: int, gamma, xp, *, beta=None, bias=None, skip=None, eps: float, center: bool,
             want_total: bool = False):
        """(y, mean, inv_std, total): mean and inv_std shaped x.shape[:first_axis] + (1, ...) as the array
        path keeps them; mean None when not centered, total (x + skip + bias) None unless asked for."""
        width = math.prod(x.shape[first_axis:])
        rows = x.size // width if width else 0
        stats_shape = x.shape[:first_axis] + (1,) * (x.ndim - first_axis)
        y = xp.empty(x.shape, dtype=np.float32)
        mean, inv_std = xp.empty(stats_shape, dtype=np.float32), xp.empty(stats_shape, dtype=np.float32)
        total = xp.empty(x.shape, dtype=np.float32) if want_total else None
        if rows:
            null = xp.zeros(1, dtype=np.float32)
            present = {"skip": skip is not None, "bias": bias is not None, "beta": beta is not None,
                       "center": center, "total": want_total, "stats": True}
            flags = sum(NORM_FLAGS[name] for name, on in present.items() if on)

            def flat(a):
                return null if a is None else xp.ascontiguousarray(a).reshape(-1)
            self.functions[NORM](_grid(rows), (BLOCK[NORM],),
                                 [flat(x), flat(skip), flat(bias), flat(gamma), flat(beta), y, flat(total),
                                  mean, inv_std, np.int64(rows), np.int32(width), np.float32(eps), np.int32(flags)])
            self.launches += 1
        return y, (mean if center else None), inv_std, total
