import subprocess
import sys

import numpy as np
import pytest

from infc.compiler.autotune import cpu_gemm
from infc.compiler.autotune.config import Config
from infc.compiler.autotune.tuner import WallClockBench, check_output, tune
from infc.compiler.runtime import gemm_impls

# (M, N, K): skinny and square M, N under and over every block size and not a multiple of any.
SHAPES = [(1, 300, 64), (5, 1100, 96), (64, 520, 128)]


def _data(m, n, k, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)


@pytest.mark.parametrize("config", cpu_gemm.CANDIDATES, ids=str)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_every_candidate_matches_the_float64_product(config, m, n, k):
    a, w = _data(m, n, k)
    packed = cpu_gemm.prepack(config, w)
    reference = a.astype(np.float64) @ w.astype(np.float64)
    y = gemm_impls.run_gemm(config.impl, a, packed, config.kwargs())
    assert y.flags.c_contiguous and y.dtype == np.float32
    assert check_output(y, reference, 1e-4, "float32") is None

    out = np.full((m, n), np.nan, dtype=np.float32)  # the arena's buffer: must be overwritten completely
    assert gemm_impls.run_gemm(config.impl, a, packed, config.kwargs(), out=out) is not None
    assert check_output(out, reference, 1e-4, "float32") is None

    batched = gemm_impls.run_gemm(config.impl, a.reshape(1, m, k), packed, config.kwargs())  # leading dims fold into M
    assert batched.shape == (1, m, n)
    assert check_output(batched[0], reference, 1e-4, "float32") is None


def test_threads_are_restored_after_a_one_thread_run():
    libraries = gemm_impls._blas_libraries()
    if not libraries:
        pytest.skip("threadpoolctl is not installed")
    before = [library.num_threads for library in libraries]
    a, w = _data(4, 64, 32)
    gemm_impls.run_gemm("matmul", a, {"w": w}, {"threads": 1})
    assert [library.num_threads for library in libraries] == before


def test_tuning_a_real_problem_picks_a_correct_candidate():
    key = cpu_gemm.gemm_key(3, 1100, 64, "float32", "test-target")
    result = tune(cpu_gemm.gemm_problem(key, num_cores=2), WallClockBench(warmup=0, min_runs=1, max_runs=2), rounds=1)
    assert {c.status.split(":")[0] for c in result.candidates} <= {"ok", "pruned"}
    assert result.result_of(result.winner).is_ok
    assert result.result_of(Config.of("matmul_blocked", block=1024)).is_ok  # N=1100 needs two panels
    assert result.key.dim("M") == 4  # tuned at the bucket's own M


def test_prune_rules():
    prune = cpu_gemm.prune_for(cpu_gemm.gemm_key(8, 768, 768, "float32", "t"), num_cores=1)
    assert prune(Config.of("matmul_blocked", block=1024)) == "one panel holds all of N"
    assert prune(Config.of("matmul_blocked", block=512)) is None
    assert prune(Config.of("matmul", threads=1)) == "no fewer threads than cores"
    assert cpu_gemm.prune_for(cpu_gemm.gemm_key(8, 768, 768, "float32", "t"), num_cores=2)(Config.of("matmul", threads=1)) is None


def test_keys_name_the_gemm_problem_only():
    # Two models with a 3-row and a 4-row GEMM of the same weight shape share the bucket and the key.
    assert str(cpu_gemm.gemm_key(3, 768, 3072, "float32", "t")) == str(cpu_gemm.gemm_key(4, 768, 3072, "float32", "t"))
    assert str(cpu_gemm.gemm_key(5, 768, 3072, "float32", "t")) != str(cpu_gemm.gemm_key(4, 768, 3072, "float32", "t"))
    assert f"src={cpu_gemm.KERNEL_SOURCE_HASH}" in str(cpu_gemm.gemm_key(1, 8, 8, "float32", "t"))


def test_the_vendor_is_plain_matmul_and_every_impl_has_a_prepack():
    assert cpu_gemm.VENDOR == Config("matmul") and cpu_gemm.CANDIDATES[0] == cpu_gemm.VENDOR
    every = cpu_gemm.CANDIDATES + cpu_gemm.BF16_CANDIDATES
    assert set(cpu_gemm.PREPACKS) == set(gemm_impls.IMPLS) == {c.impl for c in every}


def test_bad_calls_raise_clear_errors():
    a, w = _data(2, 8, 4)
    with pytest.raises(ValueError, match="unknown GEMM impl 'nope'"):
        gemm_impls.run_gemm("nope", a, {"w": w}, {})
    with pytest.raises(ValueError, match="out must be C-contiguous"):
        gemm_impls.run_gemm("matmul", a, {"w": w}, {}, out=np.empty((8, 2), np.float32))
    with pytest.raises(ValueError, match="activation has 4 columns, the weight 5 rows"):
        gemm_impls.run_gemm("matmul", a, {"w": np.ones((5, 8), np.float32)}, {})


def test_the_runtime_impls_do_not_import_the_compiler_half():
    code = ("import sys, infc.compiler.runtime.gemm_impls; "
            "bad = [m for m in sys.modules if m.startswith(('infc.compiler.autotune', 'infc.compiler.passes'))]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bf16_keys_race_the_bf16_kernels_on_bf16_values():
    from infc.compiler.runtime import bf16_gemm

    key = cpu_gemm.gemm_key(20, 200, 96, cpu_gemm.BF16, "test-target")
    assert key.dtypes == (cpu_gemm.BF16, cpu_gemm.BF16, "float32")
    assert str(key) != str(cpu_gemm.gemm_key(20, 200, 96, "float32", "test-target"))
    problem = cpu_gemm.gemm_problem(key, num_cores=2)
    assert set(cpu_gemm.BF16_CANDIDATES) <= set(problem.configs) and problem.out_dtype == "float32"
    assert not set(cpu_gemm.BF16_CANDIDATES) & set(cpu_gemm.gemm_problem(cpu_gemm.gemm_key(20, 200, 96, "float32", "t")).configs)
    result = tune(problem, WallClockBench(warmup=0, min_runs=1, max_runs=2), rounds=1)
    for config in cpu_gemm.BF16_CANDIDATES:  # correct where the CPU has the instructions, else pruned
        status = result.result_of(config).status
        available = cpu_gemm.BF16_HOST_CHECKS[config.param("kernel")][0]()
        assert status == "ok" if available else status.startswith("pruned"), (config, status)
    with bf16_gemm.disabled():  # a CPU without them: pruned with the reason, never run
        prune = cpu_gemm.prune_for(key, num_cores=2)
        assert prune(Config.of("matmul_bf16", kernel="amx")) == "no usable AMX-BF16 on this CPU"
        assert prune(Config.of("matmul_bf16", kernel="avx512")) == "no AVX512-BF16 on this CPU"
