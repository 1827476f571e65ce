"""The generated kernels run on the CPU emulator (compiler/codegen/emu/cuda_emu.h) against the
float64 reference: tails, every epilogue, split-K, int8, both cp.async modes (eager copies catch
a stage overwritten while read, deferred copies catch a missing wait). Shapes are small."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from infc.compiler.codegen import emulate
from infc.compiler.codegen.problems import make_problem
from infc.compiler.codegen.reference import relative_error
from infc.compiler.codegen.variants import BY_NAME

# (variant, M, N, K, run options): tails in M, N and K for every family.
CASES = [
    ("simt_f32_128x128x8x8x8_bias_gelu", 130, 136, 36, {}),
    ("simt_f32_64x32x16x4x4_plain", 33, 31, 37, {}),           # odd N, K % 4 != 0: scalar loads
    ("simt_f32_128x128x8x8x8_bias_swiglu_res_tobf16", 70, 260, 40, {}),
    ("mma_bf16_128x128x32x2x2x4_plain", 136, 72, 200, {"eager": True}),
    ("mma_bf16_128x128x32x2x2x4_plain", 136, 72, 200, {"eager": False}),
    ("mma_f16_64x64x64x2x2x4_bias_swiglu_res_tof32", 70, 140, 136, {"eager": False}),
    ("mma_bf16_128x256x64x2x4x3_tof32", 130, 264, 200, {"eager": False}),  # 8 warps, BK 64, tails on M, N, K
    ("mma_f16_256x128x64x4x2x3_plain", 70, 130, 136, {"eager": True}),
    ("mma_bf16_128x128x64x2x2x3_plain", 136, 72, 200, {"eager": True}),  # 4 warps, BK 64: copies over 3 k-steps
    ("mma_bf16_128x128x64x2x2x3_plain", 136, 72, 200, {"eager": False}),
    ("mma_f16_256x128x64x4x2x4_bias_swiglu_res_tof32", 260, 136, 264, {"eager": False}),  # 4 stages, more k-tiles
    # The epilogue through shared memory: 16-byte row pieces of C where N allows them (N % 8 for 16-bit
    # output, N % 4 for fp32, of the SwiGLU output's N / 2), one by one where not; row tails on M.
    ("mma_bf16_128x256x64x2x4x3_plain", 136, 264, 200, {"eager": True}),
    ("mma_bf16_128x256x64x2x4x3_plain", 136, 264, 200, {"eager": False}),
    ("mma_bf16_128x256x64x2x4x3_tof32", 70, 262, 72, {"eager": True}),               # fp32 rows one by one
    ("mma_bf16_128x128x32x2x2x4_swiglu", 130, 272, 64, {"eager": False}),           # staged bf16, 136 columns
    ("mma_bf16_128x128x32x2x2x4_swiglu", 20, 260, 40, {"eager": True}),             # 130 columns: one by one
    ("mma_bf16_128x128x32x2x2x4_bias_gelu_res", 150, 264, 72, {"eager": True}),     # fp32 staged, bf16 pieces
    ("mma_bf16_128x256x64x2x4x3_bias_swiglu_res_tof32", 130, 528, 136, {"eager": False}),
    ("mma_bf16_128x128x32x2x2x4_silu", 20, 36, 72, {"eager": True}),
    ("mma_f16_128x128x32x2x2x4_bias_res", 17, 30, 48, {"eager": True}),
    ("skinny_bf16_1x1x8x4x0_plain", 5, 100, 1000, {}),
    ("skinny_bf16_4x2x4x1x0_plain", 16, 136, 1000, {"num_splits": 3}),  # NW 4: a partial column group
    ("skinny_bf16_1x1x8x4x0_bias_gelu_res", 8, 64, 2048, {"num_splits": 4}),
    ("skinny_f16_2x8x4x1x0_bias_swiglu_res_tof32", 50, 96, 520, {"num_splits": 3}),
    ("skinny_bf16_1x1x8x4x0_bias_relu", 1, 40, 96, {"num_splits": 2}),
    ("skinny_int8_bf16_1x1x8x8x0_bias", 3, 72, 712, {}),
    ("skinny_int8_f16_2x8x4x1x0_bias_swiglu_res_tof32", 64, 64, 1024, {"num_splits": 2}),
    ("skinny_int8_bf16_2x1x8x4x0_plain", 2, 40, 2200, {"num_splits": 2}),     # deep KU: a tail inside the unrolled steps
    ("skinny_int8_f16_2x2x8x4x0_bias_swiglu_res_tof32", 16, 70, 1496, {}),
    # shared-memory rings: deferred copies catch a slot read before its wait or refilled too early
    ("skinny_int8_bf16_1x1x8x4x4_plain", 3, 72, 1496, {"num_splits": 2, "eager": False}),
    ("skinny_int8_f16_1x1x8x4x4_plain", 1, 40, 2200, {"eager": True}),
    ("skinny_bf16_1x2x8x2x4_plain", 16, 100, 1000, {"eager": True}),
    ("skinny_int8_f16_1x1x8x4x4_bias_swiglu_res_tof32", 7, 64, 1032, {"num_splits": 3, "eager": False}),
]


@pytest.fixture(scope="module")
def libs(emu_dir, needs_cxx):
    names = sorted({case[0] for case in CASES} | {"skinny_bf16_2x2x4x2x0_plain"})
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(names, pool.map(lambda n: emulate.build(BY_NAME[n], emu_dir), names)))


@pytest.mark.parametrize("name,M,N,K,options", CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}x{c[3]}-{i}" for i, c in enumerate(CASES)])
def test_matches_reference(libs, name, M, N, K, options):
    variant = BY_NAME[name]
    problem = make_problem(variant, M, N, K, np.random.default_rng(M * N + K))
    out = problem.decode(emulate.run(problem, libs[name], **options))
    err = relative_error(out, problem.reference())
    assert not np.isnan(out).any(), "unwritten output elements"
    assert err <= problem.tolerance, f"relative error {err:.3g} > {problem.tolerance}"


def test_split_k_is_deterministic_and_batch_invariant(libs):
    variant = BY_NAME["skinny_bf16_2x2x4x2x0_plain"]
    problem = make_problem(variant, 16, 48, 1024, np.random.default_rng(5))
    first = emulate.run(problem, libs[variant.name], num_splits=4)
    assert np.array_equal(first, emulate.run(problem, libs[variant.name], num_splits=4))
    one_row = dataclasses.replace(problem, M=1, arrays={**problem.arrays, "a": problem.arrays["a"][:1]})
    assert np.array_equal(emulate.run(one_row, libs[variant.name], num_splits=4)[0], first[0])
    other = problem.decode(emulate.run(problem, libs[variant.name], num_splits=1))
    assert relative_error(other, problem.decode(first)) < 1e-2  # another split count: other rounding only


def test_deferred_copies_catch_a_missing_wait(emu_dir, needs_cxx, monkeypatch):
    """The emulator's own check: a pipeline that waits one group too few reads stale tiles."""
    from infc.compiler.codegen import generate

    text = generate.template_text
    broken = text("mma.cuh").replace("cp_async_wait<STAGES - 2>();", "cp_async_wait<STAGES - 1>();")
    monkeypatch.setattr(generate, "template_text", lambda name: broken if name == "mma.cuh" else text(name))
    variant = BY_NAME["mma_bf16_64x64x64x2x2x4_plain"]
    problem = make_problem(variant, 64, 64, 512, np.random.default_rng(3))
    lib = emulate.build(variant, emu_dir)
    assert relative_error(problem.decode(emulate.run(problem, lib, eager=True)), problem.reference()) < 1e-2
    assert relative_error(problem.decode(emulate.run(problem, lib, eager=False)), problem.reference()) > 0.1
