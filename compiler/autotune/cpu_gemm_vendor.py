"""A tuned GEMM step against onnxruntime's MatMul (the vendor tactic, runtime/vendor_op.py).

After the GEMM tuner picked the fastest BLAS recipe per M bucket (cpu_gemm.py), the whole step
competes with onnxruntime's MLAS SGEMM on a prepacked weight at each M the profile reaches: on
transformer shapes MLAS measured 1.3-1.7x the BLAS recipes here. Same tuner, timing cache and
checks as every other problem; the key holds M exactly (not its bucket: the step is timed as it will
run), N, K and the BLAS recipe the native side runs at that M.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..runtime import bf16_gemm, gemm_impls, vendor_op
from ..runtime.kernels import tuned_gemm
from ..runtime.kernels.common import KernelContext
from .config import Config
from .key import TuningKey, vendor_source_hash
from .tuner import Problem

OP = "MatMulStep"
VENDOR = Config(vendor_op.TACTIC)
NATIVE = Config(vendor_op.NATIVE)
CANDIDATES = (VENDOR, Config.of(vendor_op.TACTIC, threads=1), NATIVE)
# the sources a timing holds for (with onnxruntime's version: key.vendor_source_hash)
KERNEL_SOURCES = (gemm_impls, bf16_gemm, tuned_gemm, vendor_op, Path(__file__))


def native_recipe(attrs: dict, m: int) -> str:
    variant = next((v for v in attrs["variants"] if m <= v["m_max"]), None)
    rounding = f"+round_to={attrs['round_to']}" if attrs.get("round_to") else ""
    if variant is None:
        return "matmul" + rounding
    params = ",".join(f"{k}={v}" for k, v in sorted(variant["params"].items()))
    return variant["impl"] + (f"({params})" if params else "") + rounding


def gemm_step_key(m: int, k: int, n: int, recipe: str, target: str, *, sources: str | None = None) -> TuningKey:
    return TuningKey(OP, (("M", m), ("N", n), ("K", k)), ("float32",) * 3, ("row", "row"),
                     f"native={recipe.replace('|', '/')}", target, sources or vendor_source_hash(*KERNEL_SOURCES))


def gemm_step_problem(key: TuningKey, step: dict, weights: dict, a_shape, opset: int, *, seed: int = 0) -> Problem:
    """The TunedMatMul step as the plan holds it (its variants and packed weights) on seeded random
    activations, against a one-node MatMul session on its original weight."""
    rng = np.random.default_rng(seed)
    w = weights[step["inputs"][1]]
    a = (rng.standard_normal(a_shape) / math.sqrt(w.shape[0])).astype(np.float32)
    if any(v["impl"] in gemm_impls.BF16_IMPLS for v in step["attrs"]["variants"]):
        a = bf16_gemm.bf16_values(a)  # a bf16 kernel's step reads bf16 values (tune_plan.py)
    inputs = [a] + [weights[name] for name in step["inputs"][1:]]
    kernel = tuned_gemm.tuned_matmul
    attrs = step["attrs"]

    def build(config: Config):
        if config.impl == vendor_op.TACTIC:
            vendor = vendor_op.vendor_runner("TunedMatMul", "infc.cpu", {}, ["a", "w"], {"w": w},
                                             threads=config.param("threads"))
            run = lambda: vendor([a, w], {}, None)[0]  # noqa: E731
        else:
            ctx = KernelContext(opset, [None])
            run = lambda: kernel(inputs, attrs, ctx)[0]  # noqa: E731
        run.config = config  # lets a test's benchmark tell the candidates apart
        return run

    if attrs.get("round_to"):  # a step that rounds its output to bf16 (kernels/tuned_gemm.py): held to bf16's tolerance
        return Problem(key, VENDOR, CANDIDATES, build, lambda: a.astype(np.float64) @ w.astype(np.float64),
                       out_dtype="bfloat16")
    return Problem(key, VENDOR, CANDIDATES, build, lambda: a.astype(np.float64) @ w.astype(np.float64),
                   out_dtype="float32")
