"""`infc build --target cuda` end to end on a stand-in device (tests/cuda/conftest.py): GPU tuning per
shape bucket with cuBLAS always a candidate, real nvcc sm_90 cubins of the winners as plan
sections, and the plan loaded through PlanSession into the device executor (NumPy backend, the
winner's launches on the CPU emulator), checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from infc.compiler import target
from infc.compiler.build import BuildOptions, build
from infc.compiler.codegen.chain_kernel import chain_ops
from infc.compiler.codegen.row_kernels import row_entries
from infc.compiler.codegen.compile import find_nvcc
from infc.compiler.codegen.variants import variant_named
from infc.compiler.plan.format import read_plan
from infc.compiler.runtime.feeds_io import random_plan_feeds
from infc.compiler.runtime.session import PlanSession
from infc.compiler.verify import ort_session
from infc.compiler.model_io import load_model
from infc.compiler.runtime.step_profile import profile_report, timing_steps

from .conftest import EMULATED, EMULATED_LOW

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc (CUDA 13.0) not installed")


def run_against_onnxruntime(plan_path, model_path, limit: float) -> PlanSession:
    """The plan through PlanSession on seeded random inputs against onnxruntime's fp32 model: every output
    copied back to the host and within `limit` (max |diff| / max |ref|). Returns the session."""
    session = PlanSession(plan_path)
    feeds = session.check_feeds(random_plan_feeds(session, 11), "random")
    names = session.output_names
    expected = ort_session(load_model(model_path)).run(names, feeds)
    actual = session.run(feeds)
    for name, want in zip(names, expected):
        got = actual[name]
        assert isinstance(got, np.ndarray) and type(got) is np.ndarray  # copied back to the host
        error = np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30)
        assert error <= limit, f"{name}: max error {error:.2e}"
    return session


@pytest.mark.parametrize("model", ["cnn_ts.onnx", "bert_ts.onnx"])
def test_cuda_plan_matches_onnxruntime(model, tmp_path, stand_in_device):
    path = f"tests/models/{model}"
    plan_path = tmp_path / "model.plan"
    report = build(path, None, str(plan_path), BuildOptions(target="cuda", cache_dir=tmp_path / "cache", show_progress=False))
    assert report["target"] == "cuda" and report["fingerprint"]["kind"] == "cuda"
    plan = read_plan(plan_path)
    cuda = plan.meta["cuda"]
    assert cuda["gemms"], "every GEMM site is recorded"
    for row in plan.meta["tuning"]:  # cuBLAS always competes; rates and % of cuBLAS reported
        names = [c["config"] for c in row["candidates"]]
        assert "cublas" in names
        assert row["winner"] in (EMULATED, "cublas")
        assert all(c["tflops"] and c["gb_s"] for c in row["candidates"] if c["status"] == "ok")
    won = {row["winner"] for row in plan.meta["tuning"]}
    assert (EMULATED in won) == bool(cuda["kernels"])  # the winner's tile, plain or with a site's epilogue
    assert {variant_named(name).tile for name in cuda["kernels"]} <= {variant_named(EMULATED).tile}
    for entry in cuda["gemms"]:  # a fused epilogue only where a generated kernel won
        fused = [c for c in entry["choices"] if c.get("fused")]
        assert bool(fused) == ("epilogue" in entry)
        assert all(variant_named(c["kernel"]).params["bias"] == (entry["epilogue"]["bias"] is not None) for c in fused)
    for name, info in cuda["kernels"].items():
        assert plan.sections[info["section"]].tobytes().startswith(b"\x7fELF")
        assert info["resources"]["stack_frame"] == 0

    session = run_against_onnxruntime(plan_path, path, 1e-4)
    placed = session.executor.report()
    assert placed["placement"].get("device gemm", 0) == len(cuda["gemms"])
    launched = placed["gemm_launches"]
    assert sum(launched.values()) == len(cuda["gemms"])
    if EMULATED in cuda["kernels"]:
        assert launched.get(EMULATED)
    assert set(stand_in_device) == set(cuda["kernels"]) | set(cuda["chains"]) | set(cuda["rows"])  # every cubin
    # loaded, from the plan; the row kernels the program's softmax / attention / norm steps launch
    assert sorted(cuda["rows"]) == row_entries(plan.meta["program"])
    assert bool(placed["row_launches"]) == bool(cuda["rows"]) and (model != "bert_ts.onnx" or len(cuda["rows"]) == 2)
    chain_steps = [i for i, step in enumerate(plan.meta["program"]) if chain_ops(step) is not None]
    absorbed = {i for entry in cuda["gemms"] for i in (entry.get("epilogue") or {}).get("absorbed", ())}
    compiled = sorted(i for info in cuda["chains"].values() for i in info["steps"])
    assert compiled == [i for i in chain_steps if i not in absorbed]  # every float32 chain that still runs,
    # and every standalone activation of SINGLE_OP_CHAINS
    assert placed["chain_launches"] == len(compiled) and placed["chain_kernels"] == len(compiled)

    # `infc run --op-profile` on the device executor: each step timed (waiting for the device), by op type
    with timing_steps(session.executor) as step_times:
        session.run(session.check_feeds(random_plan_feeds(session, 12), "random"))
        step_times.runs += 1
    profile = profile_report(session.executor, step_times, [1e3])
    ops = {entry["op"] for entry in profile["ops"]}
    assert profile["steps"] and profile["steps_ms"] > 0 and not any("'" in op or " " in op for op in ops)
    assert ops & {"MatMul", "Gemm", "Conv", "infc.FusedConv"}, ops


def test_target_cuda_without_device_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(target, "probe_cuda", lambda: (None, "no CUDA device (CuPy 14.2.0 sees none)"))
    from infc.compiler.errors import BadInput

    with pytest.raises(BadInput, match="--target cuda: no CUDA device"):
        build("tests/models/cnn_ts.onnx", None, str(tmp_path / "x.plan"), BuildOptions(target="cuda", cache_dir=tmp_path))
    assert not (tmp_path / "x.plan").exists()


def test_gpu_check_end_to_end_step_on_the_stand_in(stand_in_device, tmp_path, monkeypatch):
    """bench/gpu_check.py's end-to-end step, as the H200 run will call it, on the stand-in device."""
    import argparse
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check_e2e_under_test", script)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    assert {"bert_ts.onnx", "gpt2_ts.onnx", "llama_ts.onnx", "cnn_ts.onnx"} <= {Path(m).name for m in gpu_check.E2E_MODELS}
    models = gpu_check.E2E_MODELS[:2]  # the other models' device ops: tests/cuda/test_device_ops.py
    records = gpu_check.end_to_end(argparse.Namespace(cubins=tmp_path / "cache" / "cubins"), seed=3, models=models)
    assert [Path(r["model"]).name for r in records] == ["cnn_ts.onnx", "bert_ts.onnx"]
    for record in records:
        assert record["ok"], record.get("error")
        assert record["max_rel_err"] <= 1e-4 and record["executor"]["placement"]["device gemm"] > 0
        assert record["tuning"] and record["latency_ms_median"] > 0
        assert record["host_fallback_ops"] == [] and record["self_check"]["max_rel_diff"] <= 1e-4


@pytest.mark.parametrize("model, precision", [("bert_ts.onnx", "bf16"), ("cnn_ts.onnx", "fp16")])
def test_reduced_precision_cuda_plan_runs_its_gemms_on_tensor_core_tiles(model, precision, tmp_path, stand_in_device):
    """--precision fp16/bf16 --target cuda: the sites whose weights the precision step rounded run in the low
    type (A converted exactly, fp32 output), by a tuned mma tile (here on the emulator) or cuBLAS; the plan
    stays within the issue's bf16 budget of onnxruntime's fp32 model and the self-check uses the low type's."""
    path = f"tests/models/{model}"
    plan_path = tmp_path / "model.plan"
    low = {"bf16": "bfloat16", "fp16": "float16"}[precision]
    report = build(path, None, str(plan_path), BuildOptions(target="cuda", precision=precision,
                                                            cache_dir=tmp_path / "cache", show_progress=False))
    assert report["target"] == "cuda" and report["cuda_self_check"]["max_rel_diff"] <= 2e-2
    plan = read_plan(plan_path)
    gemms = plan.meta["cuda"]["gemms"]
    assert gemms and all(entry.get("dtype") == low for entry in gemms)
    assert all(row["dtype"] == low for row in plan.meta["tuning"])
    kernels = {c["kernel"] for entry in gemms for c in entry["choices"] if c["impl"] == "kernel"}
    tiles = {variant_named(k).tile for k in kernels}
    assert kernels and tiles <= {variant_named(k).tile for k in EMULATED_LOW}  # the fake bench's fastest tile won
    assert all(variant_named(k).out_dtype == "float32" for k in kernels)
    if model == "bert_ts.onnx":  # bias (+ GELU) taken through the rounding into the tile: one rounding, not two
        fused = [entry["epilogue"] for entry in gemms if entry.get("epilogue")]
        steps = plan.meta["program"]
        assert fused and all([steps[i]["op"] for i in e["absorbed"][:2]] == ["Cast", "Cast"] for e in fused)
        # GELU's GEMMs; the residual GEMMs' bias goes to SkipLayerNormalization where that norm fuses
        assert "gelu" in {e["act"] for e in fused} <= {"none", "gelu"} and all(e["bias"] for e in fused)

    session = run_against_onnxruntime(plan_path, path, 2e-2)
    placed = session.executor.report()
    launched = placed["gemm_launches"]
    assert set(launched) <= kernels | {"cublas"} and sum(launched.get(k, 0) for k in kernels) > 0
    assert placed["rounding_steps"] > 0  # Cast pairs through the low type folded into one launch each
