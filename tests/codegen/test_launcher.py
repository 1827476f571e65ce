"""The CuPy launcher (compiler/runtime/cuda/launcher.py) on a fake CuPy whose kernels run on the CPU
emulator: cubin loading by path, the shared-memory opt-in, np.int32 arguments, split-K workspace."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from infc.compiler.codegen.cache import CubinCache
from infc.compiler.codegen.compile import compile_variant, find_nvcc
from infc.compiler.codegen.problems import make_problem
from infc.compiler.codegen.reference import relative_error
from infc.compiler.codegen.variants import BY_NAME

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc (CUDA 13.0) not installed")


def run_through_launcher(name, shape, cubin_dir, calls=1, **options):
    from infc.compiler.runtime.cuda.launcher import GemmKernel

    variant = BY_NAME[name]
    compiled = compile_variant(variant, CubinCache(cubin_dir))
    kernel = GemmKernel(compiled.cubin, compiled.name, variant.params, num_sms=4)
    problem = make_problem(variant, *shape, np.random.default_rng(sum(shape)))
    extra = {k: problem.arrays.get(k) for k in ("bias", "scale", "residual")}
    for _ in range(calls):
        flat = problem.output_buffer()
        launch = kernel(problem.arrays["a"], problem.arrays["w"], flat, *shape, **extra, **options)
        assert problem.guard_intact(flat)
        err = relative_error(problem.decode(problem.output_view(flat)), problem.reference())
        assert err <= problem.tolerance
    return kernel, launch


def test_mma_opts_into_large_shared_memory(fake_cupy, cubin_dir):
    kernel, launch = run_through_launcher("mma_bf16_128x128x32x2x2x4_bias", (40, 24, 64), cubin_dir)
    assert launch.smem_bytes > 48 * 1024 and kernel.function.max_dynamic_shared_size_bytes == launch.smem_bytes


def test_skinny_split_k_reuses_its_workspace(fake_cupy, cubin_dir):
    kernel, launch = run_through_launcher("skinny_int8_bf16_1x1x8x8x0_bias", (3, 64, 1024), cubin_dir, calls=2,
                                          num_splits=2)
    assert launch.num_splits == 2 and kernel.function.launches == 2
    assert kernel._workspace.size >= launch.workspace_floats and not kernel._counters.any()


def test_rejects_short_arrays(fake_cupy, cubin_dir):
    from infc.compiler.runtime.cuda.launcher import GemmKernel

    variant = BY_NAME["simt_f32_64x32x16x4x4_plain"]
    compiled = compile_variant(variant, CubinCache(cubin_dir))
    kernel = GemmKernel(compiled.cubin, compiled.name, variant.params, num_sms=4)
    a, w, out = (np.zeros(n, np.float32) for n in (8 * 4, 8 * 4, 8 * 7))
    with pytest.raises(ValueError, match="'out' must be a contiguous array of at least 256 bytes"):
        kernel(a, w, out, 8, 8, 4)


def test_cpu_runtime_never_imports_cupy():
    code = ("import sys; import infc.compiler.runtime.cuda.launcher, infc.compiler.runtime.cuda.geometry, "
            "infc.compiler.runtime.executor; assert 'cupy' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
