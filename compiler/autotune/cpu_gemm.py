"""CPU GEMM candidates: y = a @ w with activations a (M, K) and a constant weight w (K, N).

A candidate is data: a config whose `impl` names a run function in runtime/gemm_impls.py, plus a
prepack (looked up by the same name) that runs at build time and returns the weight arrays the plan
stores for it. What each may win, and why:

    matmul                  the vendor: NumPy -> OpenBLAS, its own threading
    matmul(threads=1)       small M: thread start-up and sync cost more than the second core brings
    dot                     the same BLAS call through np.dot (less dispatch for 2-D operands)
    matmul_wt               weight stored transposed (N, K): BLAS's op(B)=B^T kernels, another gemv for M=1
    matmul_wt_swapped       (w_t @ a^T)^T: for skinny M the row-major gemv over contiguous weight rows
    matmul_blocked(block)   column panels, each contiguous: a panel of K x block stays in L2 across rows
    matmul_bf16(kernel)     bf16 keys only (activation and weight hold bf16 values: a bf16 plan's GEMMs):
                            AMX-BF16 tiles (`amx`, 16x the float32 FMA rate a core) or AVX512-BF16
                            `vdpbf16ps` (`avx512`, 2x on CPUs that issue it as fast as an FMA)

each also with threads=1. Blocking is pruned where one panel would hold all of N, threads=1 where
the machine has a single core, the bf16 kernels where the CPU lacks their instructions. A bf16 key
is tuned on bf16 values held in float32 (what the plan's GEMM reads) against the float32 vendor.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Callable

import numpy as np

from ..runtime import amx_gemm, bf16_gemm, gemm_impls
from .buckets import DEFAULT_M_BUCKETS, bucket_of
from .config import Config
from .key import TuningKey, source_hash
from .tuner import Problem

OP = "MatMul"
LAYOUTS = ("row", "row")
BLOCK_SIZES = (256, 512, 1024)
VENDOR = Config("matmul")
# The winner is only valid for the kernels it was measured with: both files feed the key.
KERNEL_SOURCE_HASH = source_hash(gemm_impls, bf16_gemm, amx_gemm, Path(__file__))
BF16 = "bfloat16"  # a key's dtype when activation and weight hold bf16 values


def _with_threads(impl: str, **params) -> tuple[Config, Config]:
    return Config.of(impl, **params), Config.of(impl, **params, threads=1)


CANDIDATES: tuple[Config, ...] = (
    *_with_threads("matmul"),
    *_with_threads("dot"),
    *_with_threads("matmul_wt"),
    *_with_threads("matmul_wt_swapped"),
    *(config for block in BLOCK_SIZES for config in _with_threads("matmul_blocked", block=block)),
)
BF16_CANDIDATES: tuple[Config, ...] = tuple(config for kernel in gemm_impls.BF16_KERNELS
                                            for config in _with_threads("matmul_bf16", kernel=kernel))
# what each bf16 kernel needs from the CPU, asked at tuning time (never run where it is missing)
BF16_HOST_CHECKS = {"amx": (amx_gemm.has_amx_bf16, "no usable AMX-BF16 on this CPU"),
                    "avx512": (bf16_gemm.has_avx512_bf16, "no AVX512-BF16 on this CPU")}


def _as_is(w: np.ndarray, config: Config) -> dict[str, np.ndarray]:
    return {"w": np.ascontiguousarray(w)}


def _transposed(w: np.ndarray, config: Config) -> dict[str, np.ndarray]:
    return {"w_t": np.ascontiguousarray(w.T)}


def _blocked(w: np.ndarray, config: Config) -> dict[str, np.ndarray]:
    block = int(config.param("block", 512))
    panels = [np.ascontiguousarray(w[:, start: start + block]).reshape(-1) for start in range(0, w.shape[1], block)]
    return {"w_blocked": np.concatenate(panels)}


def _bf16_pairs(w: np.ndarray, config: Config) -> dict[str, np.ndarray]:
    return {"w": np.ascontiguousarray(w), "w_pairs": bf16_gemm.pack_pairs(w)}


PREPACKS: dict[str, Callable[[np.ndarray, Config], dict[str, np.ndarray]]] = {
    "matmul": _as_is,
    "dot": _as_is,
    "matmul_wt": _transposed,
    "matmul_wt_swapped": _transposed,
    "matmul_blocked": _blocked,
    "matmul_bf16": _bf16_pairs,
}
assert set(PREPACKS) == set(gemm_impls.IMPLS), "every runtime GEMM impl needs a prepack and the reverse"


def prepack(config: Config, w: np.ndarray) -> dict[str, np.ndarray]:
    """Build time: the weight arrays the plan stores for this config (names as gemm_impls reads them)."""
    return PREPACKS[config.impl](w, config)


def gemm_key(m: int, n: int, k: int, dtype: str, target: str, *, m_buckets=DEFAULT_M_BUCKETS,
             epilogue: str = "none") -> TuningKey:
    """`dtype` "float32", or BF16 for bf16 values in float32 (the output is float32 then)."""
    dtypes = (dtype, dtype, "float32" if dtype == BF16 else dtype)
    return TuningKey(OP, (("M", bucket_of(m, m_buckets)), ("N", n), ("K", k)), dtypes, LAYOUTS,
                     epilogue, target, KERNEL_SOURCE_HASH)


def _num_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def prune_for(key: TuningKey, num_cores: int | None = None) -> Callable[[Config], str | None]:
    n = key.dim("N")
    cores = num_cores or _num_cores()

    def prune(config: Config) -> str | None:
        block = config.param("block")
        if block is not None and int(block) >= n:
            return "one panel holds all of N"
        if config.param("threads") is not None and int(config.param("threads")) >= cores:
            return "no fewer threads than cores"
        if config.impl in gemm_impls.BF16_IMPLS:
            has_kernel, reason = BF16_HOST_CHECKS[config.param("kernel")]
            return None if has_kernel() else reason
        return None

    return prune


def gemm_problem(key: TuningKey, *, seed: int = 0, num_cores: int | None = None) -> Problem:
    """The tuning problem for a key, on seeded random data at the bucket's own M."""
    if key.op != OP or key.epilogue != "none":
        raise ValueError(f"cpu_gemm tunes plain {OP} keys, not {key}")
    m, n, k = key.dim("M"), key.dim("N"), key.dim("K")
    is_bf16 = key.dtypes[0] == BF16
    dtype = "float32" if is_bf16 else key.dtypes[0]
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(dtype)
    w = (rng.standard_normal((k, n)) / math.sqrt(k)).astype(dtype)
    if is_bf16:  # what the plan's GEMM reads: bf16 values as float32
        a, w = bf16_gemm.bf16_values(a), bf16_gemm.bf16_values(w)

    def build(config: Config):
        packed = prepack(config, w)
        function = gemm_impls.IMPLS[config.impl]
        params = config.kwargs()
        out = np.empty((m, n), dtype=dtype)  # the runtime writes into the arena, so candidates do too
        return lambda: function(a, packed, out=out, **params)

    return Problem(key, VENDOR, CANDIDATES + (BF16_CANDIDATES if is_bf16 else ()), build, lambda: a.astype(np.float64) @ w.astype(np.float64),
                   prune=prune_for(key, num_cores), out_dtype=dtype)
