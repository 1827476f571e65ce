"""bench/gpu_precision.py on the stand-in device (tests/cuda/conftest.py): a small encoder from
bench/make_encoder.py built for cuda at fp32, fp16 and bf16, each run and checked against onnxruntime's
fp32 model; the reduced-precision plans put their GEMM sites in the low type. Timings are meaningless here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from infc.compiler.codegen.compile import find_nvcc

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_precision.py"

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc (CUDA 13.0) not installed")


def test_fp32_fp16_bf16_plans_of_one_encoder_side_by_side(stand_in_device, tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_precision_under_test", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.precision_speed(tmp_path, tmp_path / "cache", layers=1, hidden=64, heads=4, ffn=128,
                                   batch=2, seq=8, runs=1, log=lambda msg: None)
    plans = result["plans"]
    assert set(plans) == {"fp32", "fp16", "bf16"}
    for precision, record in plans.items():
        assert record["ok"], (precision, record)
        assert record["host_fallback_ops"] == []
        low = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[precision]
        assert set(record["gemm_sites_by_dtype"]) == {low}  # every GEMM weight was rounded, so every site is low
        profile = record["op_profile"]  # where the time goes, per op type, for the next device run to read
        assert profile["steps_ms"] > 0 and profile["ops"] and len(profile["slowest_steps"]) <= 25
        assert record["row_launches"] > 0  # attention scores and the norms ran as row kernels
    assert plans["fp16"]["max_rel_err"] > plans["fp32"]["max_rel_err"]  # the low type really computed
    assert set(result["speedup"]) == {"fp16", "bf16"} and all(s > 0 for s in result["speedup"].values())
    assert any("fp16" in line and "x fp32" in line for line in bench.format_lines(result))
