"""On a CUDA device only (marker `gpu`, skipped without one): one variant per family, tails included,
through the real CuPy launcher against the float64 reference. bench/gpu_check.py checks them all."""

from __future__ import annotations

import numpy as np
import pytest

from infc.compiler.codegen.cache import CubinCache
from infc.compiler.codegen.compile import compile_variant
from infc.compiler.codegen.problems import make_problem
from infc.compiler.codegen.reference import relative_error
from infc.compiler.codegen.variants import BY_NAME

CASES = [
    ("simt_f32_128x128x8x8x8_bias_gelu", (257, 382, 131)),
    ("mma_bf16_128x128x32x2x2x4_bias_swiglu_res_tof32", (300, 262, 264)),
    ("mma_f16_128x256x64x2x4x3_plain", (513, 1030, 520)),
    ("skinny_bf16_1x1x8x4x0_bias_gelu_res", (7, 1030, 1000)),
    ("skinny_f16_2x8x4x1x0_plain", (61, 4106, 1032)),
    ("skinny_int8_bf16_1x1x8x8x0_bias_swiglu_res_tof32", (8, 1030, 1000)),
    ("skinny_int8_bf16_1x1x8x4x4_plain", (5, 4106, 1032)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("name,shape", CASES, ids=[c[0] for c in CASES])
def test_variant_on_device(name, shape, cubin_dir):
    import cupy as cp

    from infc.compiler.runtime.cuda.launcher import GemmKernel

    variant = BY_NAME[name]
    compiled = compile_variant(variant, CubinCache(cubin_dir))
    kernel = GemmKernel(compiled.cubin, compiled.name, variant.params)
    problem = make_problem(variant, *shape, np.random.default_rng())
    arrays = {k: cp.asarray(v) for k, v in problem.arrays.items()}
    flat = problem.output_buffer(xp=cp)
    kernel(arrays["a"], arrays["w"], flat, *shape, **{k: arrays.get(k) for k in ("bias", "scale", "residual")})
    cp.cuda.runtime.deviceSynchronize()
    out = problem.decode(cp.asnumpy(problem.output_view(flat)))
    assert problem.guard_intact(flat, xp=cp), "wrote past the output"
    assert not np.isnan(out).any(), "unwritten output elements"
    err = relative_error(out, cp.asnumpy(problem.reference(xp=cp)))
    assert err <= problem.tolerance, f"relative error {err:.3g}"
