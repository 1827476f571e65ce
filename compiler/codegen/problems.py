"""One checkable GEMM problem for a variant: fresh random inputs, the device-layout arrays the
kernel reads, and the float64 reference. Shared by the CPU emulator tests and bench/gpu_check.py.

Inputs are never zeros (zeros hide unwritten outputs and wrong indexing): activations and
residuals are standard normal, weights scaled by 1/sqrt(K) so outputs stay O(1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..runtime.cuda.geometry import output_shape
from . import prepack
from .reference import TOLERANCE, gemm_reference
from .variants import Variant

STORAGE = {"float32": np.float32, "bfloat16": np.uint16, "float16": np.uint16}
NAN_BF16_F16 = 0x7FC0  # a quiet NaN in both bf16 and fp16
GUARD = 64


@dataclass
class Problem:
    variant: Variant
    M: int
    N: int                                   # GEMM columns (2 H for SwiGLU)
    K: int
    arrays: dict[str, np.ndarray]            # device layout: a, w, bias, scale, residual
    logical: dict[str, np.ndarray] = field(repr=False)  # float32 values the reference uses

    @property
    def out_shape(self) -> tuple[int, int]:
        return output_shape(self.variant.params, self.M, self.N)

    @property
    def tolerance(self) -> float:
        return max(TOLERANCE[self.variant.dtype], TOLERANCE[self.variant.out_dtype])

    def output_buffer(self, xp=np):
        """Flat output storage poisoned with NaN bit patterns, GUARD elements longer than the
        output: an unwritten element fails the error check, a write past the end the guard check."""
        dtype = STORAGE[self.variant.out_dtype]
        size = self.out_shape[0] * self.out_shape[1] + GUARD
        return xp.full(size, NAN_BF16_F16 if dtype == np.uint16 else np.nan, dtype=dtype)

    def output_view(self, flat):
        return flat[:self.out_shape[0] * self.out_shape[1]].reshape(self.out_shape)

    def guard_intact(self, flat, xp=np) -> bool:
        tail = flat[self.out_shape[0] * self.out_shape[1]:]
        return bool((tail == NAN_BF16_F16).all() if tail.dtype == np.uint16 else xp.isnan(tail).all())

    def decode(self, out) -> np.ndarray:
        return prepack.from_bits(out, self.variant.out_dtype)

    def reference(self, xp=np):
        e, lg = self.variant.epilogue, self.logical
        get = (lambda name: None if lg.get(name) is None else xp.asarray(lg[name]))
        return gemm_reference(get("a"), get("w"), bias=get("bias"), act=e.act, swiglu=e.swiglu,
                              residual=get("residual"), xp=xp)


def make_problem(variant: Variant, M: int, N: int, K: int, rng: np.random.Generator) -> Problem:
    e, dtype = variant.epilogue, variant.dtype
    a = prepack.round_to(rng.standard_normal((M, K), dtype=np.float32), dtype)
    w = rng.standard_normal((N, K), dtype=np.float32) / np.float32(np.sqrt(K))
    bias = rng.standard_normal(N, dtype=np.float32) * np.float32(0.5) if e.bias else None
    arrays: dict[str, np.ndarray] = {"a": prepack.to_bits(a, dtype)}

    if variant.family == "skinny_int8":
        q, scale = prepack.quantize_int8(w)
        w = q.astype(np.float32) * scale[:, None]
        device_w, device_scale = q, scale
    else:
        w = prepack.round_to(w, dtype)
        device_w, device_scale = w, None
    device_bias = bias
    if e.swiglu:  # the kernel reads gate/up interleaved; the reference reads the halves
        device_w, device_bias = prepack.interleave_gate_up(device_w, bias)
        if device_scale is not None:
            device_scale, _ = prepack.interleave_gate_up(device_scale[:, None])
            device_scale = device_scale[:, 0]
    if variant.family.startswith("skinny"):
        kind = "int8" if variant.family == "skinny_int8" else dtype
        arrays["w"] = prepack.pack_skinny(device_w, variant.params["NW"], kind)
    else:
        arrays["w"] = prepack.to_bits(device_w, dtype)
    if device_bias is not None:
        arrays["bias"] = np.ascontiguousarray(device_bias, dtype=np.float32)
    if device_scale is not None:
        arrays["scale"] = np.ascontiguousarray(device_scale, dtype=np.float32)

    logical = {"a": a, "w": w, "bias": bias}
    problem = Problem(variant, M, N, K, arrays, logical)
    if e.residual:
        residual = prepack.round_to(rng.standard_normal(problem.out_shape, dtype=np.float32), variant.out_dtype)
        arrays["residual"] = prepack.to_bits(residual, variant.out_dtype)
        logical["residual"] = residual
    return problem
