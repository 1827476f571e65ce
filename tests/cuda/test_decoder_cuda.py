"""Decoder plans for `--target cuda` on the stand-in device (tests/cuda/conftest.py): the paged program
run by the device executor, KV pools on the device, PagedAttention and the GEMM steps as device ops;
logits and greedy tokens against the CPU plan of the same model, which matches onnxruntime
(tests/decoder/test_greedy_matches_ort.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from infc.compiler.build import BuildOptions, build
from infc.compiler.codegen.compile import find_nvcc
from infc.compiler.errors import BadInput
from infc.compiler.plan.format import read_plan
from infc.compiler.runtime.cuda.backend import DeviceArray
from infc.compiler.runtime.decode_api import SeqChunk
from infc.compiler.runtime.engine import Engine, EngineConfig
from infc.compiler.runtime.model_runner import load_model_runner
from infc.compiler.runtime.sampler import SamplingParams
from infc.compiler.runtime.scheduler_config import SchedulerConfig
from infc.compiler.runtime.sequence import Request
from infc.compiler.testing import FIXTURES

PROFILES = Path(__file__).resolve().parents[2] / "profiles"
pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc (CUDA 13.0) not installed")


def _build(model: str, target: str, folder: Path, **options) -> Path:
    plan = folder / f"{model}-{target}.plan"
    build(str(FIXTURES / f"{model}.onnx"), str(PROFILES / f"{model.split('_')[0]}_decode.yaml"), str(plan),
          BuildOptions(target=target, use_cache=False, show_progress=False, cache_dir=folder / "cache", **options))
    return plan


@pytest.mark.parametrize("model", ["llama_ts", "gpt2_dynamo"])
def test_device_decoder_plan_matches_the_cpu_plan(model, tmp_path, stand_in_device):
    device_plan, cpu_plan = _build(model, "cuda", tmp_path), _build(model, "cpu", tmp_path)
    meta = read_plan(device_plan).meta
    assert meta["target"]["kind"] == "cuda" and meta["kind"] == "decoder"
    assert meta["decoder"]["batch_invariant"] is False
    assert meta["cuda"]["self_check"]["max_rel_diff"] <= 1e-4
    assert set(stand_in_device) == set(meta["cuda"]["rows"])  # the row kernels, loaded from the plan
    assert "infc_paged_attention" in meta["cuda"]["rows"] and "infc_norm_rows" in meta["cuda"]["rows"]

    device, cpu = load_model_runner(device_plan), load_model_runner(cpu_plan)
    for runner in (device, cpu):
        runner.allocate_kv(12)
    assert all(isinstance(pool, DeviceArray) for pool in device._pools.values())
    placed = device.executor.report()
    assert not {"infc.PagedAttention", "infc.BatchInvariant"} & set(placed["host_fallback_ops"])
    steps = [[SeqChunk(0, list(range(3, 23)), 0, [0, 1], True), SeqChunk(1, [7, 8, 9], 0, [2], False)],
             [SeqChunk(1, [10], 3, [2], True), SeqChunk(0, [5], 20, [0, 1], True), SeqChunk(2, [4] * 17, 0, [3, 4], True)],
             [SeqChunk(2, [11], 17, [3, 4], True)]]
    for chunks in steps:
        got, want = device.step(chunks), cpu.step(chunks)
        assert type(got) is np.ndarray and got.shape == want.shape
        error = np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()
        assert error <= 1e-4, f"logits {error:.2e} off the CPU plan's"
    assert device.executor.report()["row_launches"] >= 2 * len(steps) * meta["decoder"]["num_layers"]  # attention, norms


def test_device_decoder_serves_greedy_requests_like_the_cpu_plan(tmp_path, stand_in_device):
    plans = {target: _build("llama_ts", target, tmp_path) for target in ("cuda", "cpu")}
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 128, n).tolist() for n in (5, 19, 33, 2)]
    tokens = {}
    for target, plan in plans.items():
        engine = Engine(load_model_runner(plan), EngineConfig(SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=24),
                                                              num_kv_blocks=16))
        seqs = engine.run([Request(prompt_ids=p, params=SamplingParams(max_tokens=6, ignore_eos=True)) for p in prompts])
        tokens[target] = [s.output_ids for s in seqs]
    assert all(len(t) == 6 for t in tokens["cpu"])
    assert tokens["cuda"] == tokens["cpu"]


def test_device_decoder_plans_are_fp32(tmp_path, stand_in_device):
    with pytest.raises(BadInput, match="decoder plans on the GPU are fp32"):
        _build("llama_ts", "cuda", tmp_path, precision="w8")


def test_gpu_decode_bench_runs_on_the_stand_in(tmp_path, stand_in_device):
    """bench/gpu_decode.py (gpu_check's "serve" section): what a device session runs, checked here first."""
    import importlib.util

    script = Path(__file__).resolve().parents[2] / "bench" / "gpu_decode.py"
    spec = importlib.util.spec_from_file_location("gpu_decode_under_test", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    records = bench.measure(tmp_path, tmp_path / "cache", models=bench.MODELS[:1], requests=3, input_len=9, output_len=4)
    record = records[0]
    assert "error" not in record, record.get("error")
    assert record["greedy_agreement"] == 1.0 and record["self_check"]["max_rel_diff"] <= 1e-4
    assert record["tpot_ms_cpu_over_gpu"] and record["output_tok_s_gpu_over_cpu"]


def test_inspect_says_where_a_device_decoder_plan_runs(tmp_path, stand_in_device):
    import json
    import subprocess
    import sys

    plan = _build("llama_ts", "cuda", tmp_path)
    shown = subprocess.run([sys.executable, "-m", "infc.cli", "inspect", str(plan), "--json"], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["target"]["kind"] == "cuda" and "not batch-invariant" in report["decoder"]["gemm_invariance"]
    text = subprocess.run([sys.executable, "-m", "infc.cli", "inspect", str(plan)], capture_output=True, text=True)
    assert text.returncode == 0 and "cuBLAS: not batch-invariant" in " ".join(text.stdout.split())
    assert "GPU row kernels: infc_norm_rows, infc_paged_attention" in text.stdout and "GPU self-check: logits" in text.stdout


def test_a_quantize_dynamic_decoder_runs_float32_on_the_device(tmp_path, stand_in_device):
    """The CPU plan quantizes such a file's activations per row and reads only the codes; the device
    plan takes the dequantized weights (decoder/device_plan.py) and checks itself against them."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantized = tmp_path / "llama_ts_quantized.onnx"
    quantize_dynamic(str(FIXTURES / "llama_ts.onnx"), str(quantized), weight_type=QuantType.QInt8, per_channel=True)
    plan = tmp_path / "quantized-cuda.plan"
    build(str(quantized), str(PROFILES / "llama_decode.yaml"), str(plan),
          BuildOptions(target="cuda", use_cache=False, show_progress=False, cache_dir=tmp_path / "cache"))
    meta = read_plan(plan).meta
    gemms = [s for s in meta["program"] if s["op"] == "BatchInvariant"]
    assert gemms and not any("row_quantized" in s["attrs"] or "weight_group" in s["attrs"] for s in gemms)
    assert all(s["inputs"][1] and len(s["inputs"]) == 2 for s in gemms)
    assert meta["cuda"]["self_check"]["max_rel_diff"] <= 1e-4
