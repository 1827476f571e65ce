"""GPU GEMM candidates: C = A @ W^T with A (M, K) activations and W (N, K) a constant weight.

Per key (M bucket, N, K, dtype) the candidates are the generated variants (compiler/codegen) that
can run the shape, with the plain epilogue, plus cuBLAS (the vendor, always). The device is
injected (`GpuTarget`): its array module, a `load(variant)` that compiles and loads one kernel
(nvcc or NVRTC for the device's architecture, then a CuPy launch; the CPU emulator in tests), and
the bench function (CUDA events on a GPU, a fake in tests). Inputs are fresh random data, never
zeros; each candidate's output is checked against the float64 product before it is timed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..codegen import generate, variants as variant_table
from ..codegen.variants import BY_NAME, VARIANTS, Variant, is_plain, is_plain_to_f32
from ..runtime.cuda.geometry import unsupported
from .buckets import DEFAULT_M_BUCKETS, bucket_of
from .config import Config
from .key import TuningKey, source_hash
from .tuner import TOLERANCES, Problem

OP = "GemmNT"
LAYOUTS = ("row", "nk")
VENDOR = Config("cublas")
FAMILY_FOR_DTYPE = {"float32": ("simt",), "bfloat16": ("mma",), "float16": ("mma",)}
LOW_DTYPES = ("bfloat16", "float16")
TEMPLATES = sorted(generate.TEMPLATES.glob("*.cuh"))
KERNEL_SOURCE_HASH = source_hash(generate, variant_table, Path(__file__), *TEMPLATES)
DEFAULT_L2_BYTES = 60 * 2**20


@dataclass
class GpuTarget:
    xp: Any
    fingerprint_id: str
    load: Callable[[Variant], Callable]       # variant -> launch(a, w_nk, out, M, N, K)
    bench: Callable                           # tuner BenchFn: run -> list of seconds
    l2_bytes: int = DEFAULT_L2_BYTES
    seed: int | None = None                   # None: fresh random data every tune


def gemm_key(m: int, n: int, k: int, dtype: str, target: str, *, m_buckets=DEFAULT_M_BUCKETS) -> TuningKey:
    return TuningKey(OP, (("M", bucket_of(m, m_buckets)), ("N", n), ("K", k)), (dtype, dtype, dtype), LAYOUTS,
                     "none", target, KERNEL_SOURCE_HASH)


def candidates_for(m: int, n: int, k: int, dtype: str) -> list[Config]:
    """Variants whose family serves `dtype` and whose kernel can run the shape: the plain epilogue for
    float32; for 16-bit A and W, the fp32 output a reduced-precision plan's site writes (TO_F32).
    (The skinny families read weights pre-packed for decode; one-shot sites use the dense tiles.)"""
    families = FAMILY_FOR_DTYPE.get(dtype, ())
    wanted = is_plain if dtype == "float32" else is_plain_to_f32
    return [Config.of("kernel", variant=v.name) for v in VARIANTS
            if v.family in families and v.dtype == dtype and wanted(v) and unsupported(v.params, m, n, k) is None]


def low_dtype(dtype: str) -> np.dtype:
    """The host dtype of a 16-bit GEMM operand (bfloat16 through ml_dtypes, as the CPU runtime holds it)."""
    if dtype == "bfloat16":
        import ml_dtypes  # noqa: PLC0415 - a dependency of the CPU runtime's bf16 path

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def as_bits(array):
    """What a generated kernel takes for a 16-bit operand: its bit pattern (CuPy has no native bfloat16)."""
    return array.view(np.uint16) if array.dtype.itemsize == 2 else array


def vendor_matmul(xp, a, w_nk, out) -> None:
    """cuBLAS (CuPy's matmul) into `out`; 16-bit operands give a 16-bit product, widened into fp32 `out`
    (the extra pass is what a reduced-precision plan pays when cuBLAS serves its site)."""
    if a.dtype == out.dtype:
        xp.matmul(a, w_nk.T, out=out)
    else:
        out[...] = xp.matmul(a, w_nk.T)


def rotations(bytes_per_call: int, l2_bytes: int, cap: int = 32) -> int:
    """Input sets to rotate over so that timed calls stream from memory, not from L2."""
    return max(1, min(cap, math.ceil(3 * l2_bytes / max(1, bytes_per_call))))


class GemmRun:
    """One candidate on one problem: calling it runs once and returns the output on the host (the
    tuner's numerical check); `launch(i)` runs on input set i % num_sets (what the bench times)."""

    def __init__(self, name: str, launch_one: Callable[[int], Any], sets: list, out, xp, flops: float, bytes_moved: int):
        self.name, self._launch_one, self.sets, self.out, self.xp = name, launch_one, sets, out, xp
        self.flops, self.bytes_moved = flops, bytes_moved

    @property
    def num_sets(self) -> int:
        return len(self.sets)

    def launch(self, i: int = 0) -> None:
        self._launch_one(i % len(self.sets))

    def __call__(self) -> np.ndarray:
        self.out[...] = np.nan  # poisoned: an element the kernel does not write fails the check
        self.launch(0)
        return self.out if self.xp is np else self.xp.asnumpy(self.out)


def gemm_problem(key: TuningKey, target: GpuTarget) -> Problem:
    if key.op != OP:
        raise ValueError(f"gpu_gemm tunes {OP} keys, not {key}")
    m, n, k = key.dim("M"), key.dim("N"), key.dim("K")
    dtype = key.dtypes[0]
    if dtype != "float32" and dtype not in LOW_DTYPES:
        raise ValueError(f"gpu_gemm: no GEMM kernels for {dtype}")
    xp = target.xp
    rng = np.random.default_rng(target.seed)
    storage = np.dtype(np.float32) if dtype == "float32" else low_dtype(dtype)
    # 16-bit sites: operands rounded to the low type, product accumulated and written in fp32
    a_host = rng.standard_normal((m, k), dtype=np.float32).astype(storage)
    w_host = (rng.standard_normal((n, k), dtype=np.float32) / np.float32(math.sqrt(k))).astype(storage)
    bytes_moved = (m * k + n * k) * storage.itemsize + m * n * 4
    num_sets = rotations(bytes_moved, target.l2_bytes)
    sets = [(_upload(xp, a_host), _upload(xp, w_host)) for _ in range(num_sets)]  # copies: distinct buffers
    flops = 2.0 * m * n * k

    def build(config: Config) -> GemmRun:
        out = xp.empty((m, n), dtype=np.float32)
        if config == VENDOR:
            def one(i):
                vendor_matmul(xp, sets[i][0], sets[i][1], out)
        else:
            launch = target.load(BY_NAME[str(config.param("variant"))])

            def one(i):
                launch(as_bits(sets[i][0]), as_bits(sets[i][1]), out, m, n, k)
        return GemmRun(_name(config), one, sets, out, xp, flops, bytes_moved)

    def reference() -> np.ndarray:
        return a_host.astype(np.float64) @ w_host.astype(np.float64).T

    # the check's tolerance: float32's for float32, the low type's where cuBLAS rounds its product to it
    return Problem(key, VENDOR, (VENDOR, *candidates_for(m, n, k, dtype)), build, reference,
                   out_dtype="float32", rtol=None if dtype == "float32" else TOLERANCES[dtype])


def _upload(xp, host: np.ndarray):
    """A device copy; 16-bit values travel as their bits and are viewed back (CuPy's bfloat16 is ml_dtypes')."""
    if host.dtype.itemsize != 2 or xp is np:
        return xp.array(host, copy=True)
    return xp.asarray(host.view(np.uint16)).view(host.dtype)


def table_row(result) -> dict:
    """One tuning-table entry: every candidate's median, TFLOP/s, effective GB/s and % of cuBLAS
    (time as a percentage of cuBLAS's: below 100 is faster)."""
    m, n, k = (result.key.dim(d) for d in ("M", "N", "K"))
    item = np.dtype(result.key.dtypes[0]).itemsize
    flops, nbytes = 2.0 * m * n * k, (m * k + n * k) * item + m * n * 4  # outputs are fp32

    def rates(seconds: float) -> dict:
        ok = math.isfinite(seconds) and seconds > 0
        return {"median_us": round(seconds * 1e6, 2) if ok else None,
                "tflops": _sig(flops / seconds / 1e12) if ok else None,
                "gb_s": _sig(nbytes / seconds / 1e9) if ok else None}

    pct = result.percent_of_vendor
    winner = result.result_of(result.winner)
    return {"key": str(result.key), "shape": f"M<={m} N={n} K={k}", "dtype": result.key.dtypes[0],
            "source": result.status, "winner": _name(result.winner), "note": result.note,
            "winner_pct_of_vendor": _round(pct(winner)) if winner else None,
            **{f"winner_{k_}": v for k_, v in rates(result.winner_s).items()},
            "candidates": [{"config": _name(c.config), "status": c.status, "pct_of_vendor": _round(pct(c)),
                            **rates(c.median_s)} for c in result.candidates]}


def _name(config: Config) -> str:
    return str(config.param("variant")) if config.impl == "kernel" else config.impl


def _sig(value: float) -> float:
    return float(f"{value:.4g}")


def _round(value):
    return None if value is None else round(value, 1)
