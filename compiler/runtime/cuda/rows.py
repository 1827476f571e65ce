"""Launching a plan's row kernels (compiler/codegen/templates/rows.cuh): softmax over the last axis
(MultiHeadAttention's scaled, causal-banded scores in the same pass) and the LayerNorm / RMSNorm /
SkipLayerNorm family, one block per row. As array ops each is 5-10 launches and as many passes over
memory; here it reads and writes each row once. Also a decoder plan's paged attention
(templates/paged_attention.cuh): one block per query row and head, K/V read in place from the pools.

`functions` maps an entry to fn(grid, block, args) with CuPy's RawKernel convention: a Function of the
plan's cubin on a GPU, the CPU emulator's codegen.emulate.Function in CI. Callers check `may_*` first
and keep their array path for everything else (other dtypes, broadcast operands, other axes).
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

import numpy as np

SOFTMAX, NORM, PAGED = "infc_softmax_rows", "infc_norm_rows", "infc_paged_attention"
# (C type, name) in launch order: the template's signatures (the emulator and the launches below use them)
ROW_ARGS = {
    SOFTMAX: [("const float*", "x"), ("float*", "y"), ("long long", "rows"), ("int", "T"), ("float", "scale"),
              ("int", "causal_len"), ("float", "filler")],
    NORM: [("const float*", "x"), ("const float*", "skip"), ("const float*", "bias"), ("const float*", "gamma"),
           ("const float*", "beta"), ("float*", "y"), ("float*", "total"), ("float*", "mean_out"),
           ("float*", "inv_std_out"), ("long long", "rows"), ("int", "K"), ("float", "eps"), ("int", "flags")],
    PAGED: [("const float*", "q"), ("const float*", "k_pool"), ("const float*", "v_pool"), ("const int*", "tables"),
            ("const int*", "row_seq"), ("const int*", "row_pos"), ("const float*", "slopes"), ("float*", "out"),
            ("int", "num_heads"), ("int", "kv_heads"), ("int", "head_size"), ("int", "block_size"),
            ("int", "max_blocks"), ("int", "window"), ("float", "scale"), ("float", "softcap"), ("int", "has_slopes")],
}
BLOCK = {SOFTMAX: 128, NORM: 256, PAGED: 128}  # SOFTMAX_BLOCK, NORM_BLOCK, PAGED_BLOCK in the templates
PAGED_MAX_HEAD = 256
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

    def may_paged(self, q, k_pool, num_heads: int, kv_heads: int) -> bool:
        head_size = k_pool.shape[-1]
        return (PAGED in self.functions and q.dtype == np.float32 and k_pool.dtype == np.float32
                and k_pool.flags.c_contiguous and 0 < head_size <= PAGED_MAX_HEAD and kv_heads == k_pool.shape[1]
                and num_heads % kv_heads == 0 and q.size // head_size <= INT_MAX)

    def paged_attention(self, q, k_pool, v_pool, tables, starts, context_lens, xp, *, num_heads: int, kv_heads: int,
                        scale: float, softcap: float, window: int, slopes):
        """[T, num_heads * H] float32 of q [.., T, num_heads * H] over the pools; tables, starts and
        context_lens are the step's host metadata (each row's sequence and position come from them)."""
        counts = np.diff(starts).astype(np.int64)
        num_rows = int(counts.sum())
        row_seq = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
        row_pos = (np.arange(num_rows) - np.repeat(np.asarray(starts[:-1], np.int64), counts)
                   + np.repeat(np.asarray(context_lens, np.int64) - counts, counts)).astype(np.int32)
        out = xp.empty((num_rows, num_heads * k_pool.shape[-1]), dtype=np.float32)
        if num_rows:
            has_slopes = slopes is not None and len(slopes) > 0
            self.functions[PAGED]((num_rows * num_heads,), (BLOCK[PAGED],), [
                xp.ascontiguousarray(q.reshape(num_rows, -1)), k_pool, v_pool,
                xp.asarray(np.ascontiguousarray(tables, np.int32)), xp.asarray(row_seq), xp.asarray(row_pos),
                xp.asarray(np.asarray(slopes, np.float32)) if has_slopes else xp.zeros(1, dtype=np.float32), out,
                np.int32(num_heads), np.int32(kv_heads), np.int32(k_pool.shape[-1]), np.int32(k_pool.shape[2]),
                np.int32(tables.shape[1]), np.int32(window), np.float32(scale), np.float32(softcap),
                np.int32(has_slopes)])
            self.launches += 1
        return out
