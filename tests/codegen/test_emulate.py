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
    ("mma_bf16_128x128x32x2x2x4_silu", 20, 36, 72, {"eager": True}),
    ("mma_f16_128x128x32x2x2x4_bias_res", 17, 30, 48, {"eager": True}),
    ("skinny_bf16_4x1x8x4_plain", 5, 100, 1000, {}),
    ("skinny_bf16_8x1x8x2_plain", 16, 136, 1000, {"num_splits": 3}),  # NW 8: a partial column group
    ("skinny_bf16_4x1x8x4_bias_gelu_res", 16, 64, 2048, {"num_splits": 4}),
    ("skinny_f16_4x4x4x2_bias_swiglu_res_tof32", 50, 96, 520, {"num_splits": 3}),
    ("skinny_bf16_4x1x8x4_bias_relu", 1, 40, 96, {"num_splits": 2}),
    ("skinny_int8_bf16_4x1x8x4_bias", 3, 72, 700, {}),
    ("skinny_int8_f16_4x4x4x2_bias_swiglu_res_tof32", 64, 64, 1024, {"num_splits": 2}),
    ("skinny_int8_bf16_2x1x4x16_plain", 2, 40, 2200, {"num_splits": 2}),     # deep KU: a tail inside the unrolled steps
    ("skinny_int8_f16_4x1x4x8_bias_swiglu_res_tof32", 16, 70, 1500, {}),
]


@pytest.fixture(scope="module")
def libs(emu_dir, needs_cxx):
    names = sorted({case[0] for case in CASES} | {"skinny_bf16_2x1x8x4_plain"})
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
    variant = BY_NAME["skinny_bf16_2x1x8x4_plain"]
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
