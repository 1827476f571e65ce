"""bench/gpu_check.py without a GPU: its pure parts with fake numbers, and a dry run end to end on a
fake CuPy whose kernels run on the CPU emulator (tiny shapes; timings meaningless)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from infc.compiler.codegen import variants as variants_module
from infc.compiler.codegen.compile import find_nvcc
from infc.compiler.codegen.variants import BY_NAME, VARIANTS
from infc.compiler.runtime.cuda.geometry import unsupported

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"


@pytest.fixture
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_results(gpu_check) -> dict:
    decode = [{"M": M, "N": N, "K": K, "weight_bytes": N * K * 2, "ours": "skinny_x", "ours_us": 10.0,
               "cublas_us": 13.0, "speedup": 1.3, "bw_pct": 85.0}
              for M in gpu_check.DECODE_M for N, K in gpu_check.DECODE_NK]
    for d in decode:  # int8 at 6 us: 10 / 6 against our bf16 (faster than cuBLAS's 13)
        d["int8"] = {"us": 6.0}
    results = {"device": {"name": "NVIDIA H200"}, "date": "2026-12-01", "quick": False,
               "ceilings": {"copy_tb_s": 4.3, "bf16_tflops": 790.0, "fp32_tflops": 51.0},
               "correctness": [{"variant": "a", "ok": True}, {"variant": "b", "ok": False}],
               "decode": decode, "square": {"mma_vs_cublas": 0.6, "simt_vs_sgemm": 0.7}}
    results["summary"] = gpu_check.summarize(results)
    return results


def test_imports_and_exits_cleanly_without_cupy(gpu_check, capsys):
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy installed here")
    assert gpu_check.main(["--quick"]) == 2
    assert "needs CuPy and a CUDA device" in capsys.readouterr().err


def test_arguments_and_result_path(gpu_check, monkeypatch, tmp_path):
    args = gpu_check.parse_args([])
    assert not args.quick and args.budget_s < 480 and args.cubins.name == "cubins"
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gpu_check.result_path(args, "2026-12-01", "NVIDIA H200") == tmp_path / "gpu_check-2026-12-01-nvidia-h200.json"
    monkeypatch.delenv("OUT")
    assert gpu_check.result_path(args, "d", "x").parent == gpu_check.ROOT / "bench" / "results"
    assert gpu_check.parse_args(["--quick", "--out", str(tmp_path)]).out == tmp_path
    assert args.sections == list(gpu_check.SECTIONS)
    assert gpu_check.parse_args(["--sections", "correctness,decode"]).sections == ["correctness", "decode"]
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--sections", "decode,speed"])


def test_summary_and_table_with_fake_numbers(gpu_check, tmp_path):
    results = fake_results(gpu_check)
    s = results["summary"]
    assert s["variants_failed"] == ["b"] and not s["pass"]["correct"]
    assert math.isclose(s["decode_speedup_geomean"], 1.3) and s["pass"]["decode_speedup"]
    assert s["decode_bw_pct_min_big"] == 85.0 and s["pass"]["mma"] and not s["pass"]["simt"]
    assert math.isclose(s["int8_vs_best_bf16_m1"], 10 / 6) and not s["pass"]["int8"]
    table = gpu_check.format_table(results)
    assert "int8 GEMV M=1   1.67x the best bf16 path, 4096 x 11008 (goal 1.7)  MISS" in table
    assert table.splitlines()[0].startswith("gpu_check  NVIDIA H200")
    assert "1/2 variants  FAILED: b" in table and "0.70x cuBLAS SGEMM (goal 0.8)  MISS" in table
    path = gpu_check.write_json(results, tmp_path / "r.json")
    assert json.loads(path.read_text())["summary"]["variants_checked"] == 2


def test_check_shapes_run_on_every_variant_with_tails(gpu_check):
    for v in VARIANTS:
        shapes = gpu_check.check_shapes(v, quick=False)
        assert all(unsupported(v.params, *shape) is None for shape in shapes), v.name
        tile_m = v.params.get("BM", 8 * v.params.get("MT", 1))
        assert any(M % tile_m for M, _, _ in shapes), f"{v.name}: no M tail"
    quick = gpu_check.selected_variants(VARIANTS, quick=True)
    assert {v.family for v in quick} == {v.family for v in VARIANTS} and len(quick) < 20


def test_timing_candidates_and_rotations(gpu_check):
    skinny_m64 = gpu_check.timing_candidates(VARIANTS, "skinny", 64)
    assert skinny_m64 and all(v.params["MT"] == 8 and gpu_check.is_plain(v) for v in skinny_m64)
    from infc.compiler.codegen.variants import MMA_TILES
    mma = gpu_check.timing_candidates(VARIANTS, "mma", 4096)
    assert sorted(v.tile for v in mma) == sorted(MMA_TILES) and all(gpu_check.is_plain(v) for v in mma)
    assert gpu_check.rotations(576 * 576 * 2) == 64 and gpu_check.rotations(90 * 2**20) == 2
    assert gpu_check.split_candidates(4) == [1, 2, 4, 8] and gpu_check.split_candidates(1) == [1, 2]


def test_bench_captures_short_calls_in_a_graph(gpu_check, fake_cupy):
    dev = gpu_check.Device(gpu_check.parse_args([]))
    executed = []

    def fn(i):
        (fake_cupy.captured if fake_cupy.captured is not None else executed).append(i)

    dev.bench(fn, num_rot=3, samples=5, warmup=2)
    assert executed == [0, 1, 0, 1, 2, 0]  # warm-up, the estimate, the first call on the capture stream
    assert len(fake_cupy.replays) == 5 and fake_cupy.replays[0] % 3 == 0 and fake_cupy.replays[0] >= 3
    assert dev.modes == {"graph (cupy)": 1}
    dev.bench(lambda i: 1 / 0 if fake_cupy.captured is not None else None, num_rot=1, samples=2)
    assert dev.modes["eager (ZeroDivisionError)"] == 1 and fake_cupy.captured is None


def results_pass(out_dir) -> dict:
    return json.loads(next(out_dir.glob("gpu_check-*.json")).read_text())["summary"]["pass"]


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc (CUDA 13.0) not installed")
def test_dry_run_on_the_emulator(gpu_check, fake_cupy, monkeypatch, tmp_path, cubin_dir, capsys):
    subset = [BY_NAME[n] for n in ("simt_f32_64x32x16x4x4_plain", "simt_f32_64x32x16x4x4_bias_swiglu_res_tobf16",
                                   "mma_bf16_64x64x64x2x2x4_plain", "skinny_bf16_1x1x8x4x0_plain",
                                   "skinny_bf16_2x8x4x1x0_plain", "skinny_int8_bf16_1x1x8x8x0_plain",
                                   "skinny_int8_bf16_2x8x4x1x0_plain")]
    monkeypatch.setattr(variants_module, "VARIANTS", tuple(subset))
    tiny = {"DECODE_NK": ((40, 64), (24, 96), (16, 64), (24, 32), (40, 32)), "PREFILL_M": (20, 24, 40),
            "SQUARE": 40, "COPY_ELEMS": 1024, "CEILING_SIZE": 32}
    for name, value in tiny.items():
        monkeypatch.setattr(gpu_check, name, value)
    monkeypatch.setattr(gpu_check, "check_shapes", lambda v, quick: [(7, 38, 40)] if v.family != "skinny_int8"
                        else [(3, 24, 128)])
    monkeypatch.setattr(gpu_check, "rotations", lambda nbytes, cap=64: 2)
    bench = gpu_check.Device.bench
    monkeypatch.setattr(gpu_check.Device, "bench", lambda self, fn, num_rot=1, samples=25, warmup=3, capture="cupy":
                        bench(self, fn, num_rot, samples=1, warmup=0, capture=capture))

    # the end-to-end step (build --target cuda, run the plan) is tested in tests/cuda/test_build_cuda.py
    monkeypatch.setattr(gpu_check, "end_to_end", lambda args, seed: [{"model": "m.onnx", "ok": True, "max_rel_err": 1e-7}])
    # so is the fp16/bf16-against-fp32 section (tests/cuda/test_gpu_precision_bench.py)
    monkeypatch.setattr(gpu_check, "precision_speed", lambda args: {
        "plans": {"fp32": {"ok": True}, "fp16": {"ok": True}, "bf16": {"ok": True}}, "speedup": {"fp16": 2.0, "bf16": 1.4}})
    # and the decoder-serving one (tests/cuda/test_decoder_cuda.py, the engine on a stand-in device)
    monkeypatch.setattr(gpu_check, "decode_serving", lambda args: [
        {"model": "tests/models/llama_ts.onnx", "greedy_agreement": 1.0, "tpot_ms_cpu_over_gpu": 6.0,
         "output_tok_s_gpu_over_cpu": 5.0}, {"model": "build/smollm2/model.onnx", "skipped": "not exported"}])
    assert gpu_check.main(["--quick", "--out", str(tmp_path), "--cubins", str(cubin_dir), "--workers", "2"]) == 0
    out = capsys.readouterr().out
    print(out)
    precision, serve = out.rstrip().splitlines()[-2:]  # the table comes last
    assert precision.startswith("fp16/bf16 plan  fp16 2.00x  bf16 1.40x")
    assert precision.endswith("MISS") and not results_pass(tmp_path)["precision"]  # bf16 under 1.5x
    assert serve == "decode on GPU   llama_ts: tokens 1.00 as the CPU plan's, TPOT 6.0x faster"
    results = json.loads(next(tmp_path.glob("gpu_check-*-fake-gpu-cpu-emulator.json")).read_text())
    assert "error" not in results and results["compile"]["errors"] == {}
    checked = gpu_check.selected_variants(subset, quick=True)
    assert results["summary"]["variants_checked"] == len(checked) >= 5 and not results["summary"]["variants_failed"]
    skinny = [c for c in results["correctness"] if c["variant"].startswith("skinny")]
    assert all(c["deterministic"] and c["batch_invariant"] for c in skinny)
    assert {d["M"] for d in results["decode"]} == {1, 16} and all(d["ours_us"] > 0 for d in results["decode"])
    assert any("/s2" in name for d in results["decode"] for name in d["ours_all"])
    assert all("int8" in d for d in results["decode"])
    assert results["square"]["mma"]["ours"] and results["square"]["simt"]["ours"]
    assert results["timing_modes"]
    assert results["summary"]["pass"]["e2e"] and "end to end      1/1 models" in out
