"""GPU GEMM tuning logic without a GPU: candidates per shape, the numerical check on fresh random
data before timing (an unwritten or wrong output scores infinity), cuBLAS always competing and
winning ties, the table's TFLOP/s, GB/s and % of cuBLAS, and the CUDA-event bench's batching and
buffer rotation (on a fake CuPy clock)."""

from __future__ import annotations

import time
import types

import numpy as np

from infc.compiler.autotune.gpu_bench import CudaEventBench
from infc.compiler.autotune.gpu_gemm import GpuTarget, VENDOR, candidates_for, gemm_key, gemm_problem, rotations, table_row
from infc.compiler.autotune.tuner import tune

from infc.compiler.codegen.variants import variant_named

from .conftest import numpy_launch_for

GOOD, BAD = "simt_f32_64x64x16x4x4_plain", "simt_f32_128x64x16x8x4_plain"


def skip_rows(a, w, out, M, N, K, **_):  # a kernel with a tail bug: the last row is never written
    np.matmul(a[:-1], w.T, out=out[:-1])


def target(times: dict, launches: dict) -> GpuTarget:
    def bench(run):
        return [times.get(run.name, 2e-5)] * 3
    return GpuTarget(np, "cuda-sm_90-test", lambda v: launches.get(v.name, numpy_launch_for(v)), bench)


def test_candidates_are_the_variants_that_fit_plus_cublas():
    names = [str(c.param("variant")) for c in candidates_for(100, 96, 40, "float32")]
    assert names and all(n.startswith("simt_f32_") and n.endswith("_plain") for n in names)
    assert candidates_for(100, 96, 40, "int4") == []
    problem = gemm_problem(gemm_key(100, 96, 40, "float32", "t"), target({}, {}))
    assert problem.vendor == VENDOR and problem.configs[0] == VENDOR


def test_fastest_correct_kernel_wins_and_a_wrong_one_scores_inf():
    t = target({"cublas": 1e-5, GOOD: 7e-6, BAD: 1e-6}, {BAD: skip_rows})
    result = tune(gemm_problem(gemm_key(64, 96, 40, "float32", "t"), t), t.bench)
    assert str(result.winner.param("variant")) == GOOD
    bad = next(c for c in result.candidates if c.config.param("variant") == BAD)
    assert bad.status.startswith("wrong: non-finite value") and bad.median_s == float("inf")
    row = table_row(result)
    assert row["winner"] == GOOD and row["winner_pct_of_vendor"] == 70.0
    good = next(c for c in row["candidates"] if c["config"] == GOOD)
    assert good["tflops"] == float(f"{2 * 64 * 96 * 40 / 7e-6 / 1e12:.4g}")
    assert good["gb_s"] == float(f"{(64 * 40 + 96 * 40 + 64 * 96) * 4 / 7e-6 / 1e9:.4g}")
    assert next(c for c in row["candidates"] if c["config"] == BAD)["tflops"] is None


def test_a_16_bit_site_tunes_tensor_core_tiles_with_fp32_output_against_cublas():
    """fp16 / bf16 plans: A and W rounded to the low type, fp32 accumulation and output; a tile that reads
    the operands as the wrong type fails the check before timing."""
    for dtype, short in (("bfloat16", "bf16"), ("float16", "f16")):
        names = [str(c.param("variant")) for c in candidates_for(64, 96, 40, dtype)]
        assert names and all(n.startswith(f"mma_{short}_") and n.endswith("_tof32") for n in names)
        good, wrong_type = names[0], names[1]
        misread = numpy_launch_for(variant_named(wrong_type.replace(f"_{short}_", "_bf16_" if short == "f16" else "_f16_")))
        t = target({"cublas": 1e-5, good: 6e-6, wrong_type: 1e-6}, {wrong_type: misread})
        problem = gemm_problem(gemm_key(64, 96, 40, dtype, "t"), t)
        result = tune(problem, t.bench)
        assert str(result.winner.param("variant")) == good
        assert next(c for c in result.candidates if c.config.param("variant") == wrong_type).status.startswith("wrong")
        assert next(c for c in result.candidates if c.config == VENDOR).status == "ok"  # cuBLAS's 16-bit product
        reference = problem.reference()  # the exact product of the rounded operands
        assert np.count_nonzero(reference) == reference.size
    assert candidates_for(64, 96, 36, "bfloat16") == []  # K % 8: no 16-byte chunks; cuBLAS serves it


def test_ties_go_to_cublas():
    t = target({"cublas": 1e-5, GOOD: 0.99e-5}, {})
    result = tune(gemm_problem(gemm_key(64, 96, 40, "float32", "t"), t), t.bench)
    assert result.winner == VENDOR


def test_inputs_are_fresh_random_data():
    one = gemm_problem(gemm_key(8, 16, 32, "float32", "t"), target({}, {}))
    two = gemm_problem(gemm_key(8, 16, 32, "float32", "t"), target({}, {}))
    ref_one, ref_two = one.reference(), two.reference()
    assert np.count_nonzero(ref_one) == ref_one.size and not np.array_equal(ref_one, ref_two)


def test_rotation_covers_three_l2_sizes():
    assert rotations(10 * 2**20, 60 * 2**20) == 18
    assert rotations(1 << 30, 60 * 2**20) == 1


def test_event_bench_batches_and_rotates():
    clock = {"t": 0.0}

    class Event:
        def record(self, stream=None):
            self.t = clock["t"]

        def synchronize(self):
            pass

    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Event=Event, runtime=types.SimpleNamespace(deviceSynchronize=lambda: None),
        get_elapsed_time=lambda start, end: (end.t - start.t) * 1e3))
    seen = []

    class Run:
        num_sets = 4

        def launch(self, i):
            seen.append(i)
            clock["t"] += 5e-6  # every call "takes" 5 us on the device clock
            time.sleep(0)

    times = CudaEventBench(cupy, warmup=2, samples=5, batch_s=1e-4)(Run())
    assert len(times) == 5 and all(abs(t - 5e-6) < 1e-12 for t in times)
    assert set(seen) == {0, 1, 2, 3}
