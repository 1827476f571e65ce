"""GPU check of the generated GEMM kernel families (issue #4): one command, under 8 minutes on an H200.

    python3 bench/gpu_check.py [--quick] [--out DIR] [--cubins DIR] [--workers N] [--budget-s S]

1. compiles every variant (compiler/codegen/variants.py) to an sm_90 cubin with nvcc (cached by
   content in --cubins, default cache/cubins: carry it to skip compiling);
2. measures the ceilings: device-to-device copy bandwidth, cuBLAS fp32 (CuPy) and bf16/fp16
   (torch when present, CuPy's too when it has them);
3. checks every variant on fresh random inputs, tail shapes included, against a float64
   reference (relative error <= 1e-5 fp32, 1e-2 bf16/fp16; output poisoned with NaN first so
   every element must be written; a guard after the output catches writes past it; skinny
   kernels also run twice for determinism and at M = 1 for batch invariance);
4. times the kernels against cuBLAS with CUDA events (warm-up, median of batches of calls
   rotating over enough buffer copies to defeat the 60 MB L2): decode M in {1..64} x five
   (N, K), prefill M in {512, 2048, 4096}, and 4096^3 for the mma and SIMT acceptance lines;
5. end to end: `infc build --target cuda` of the test models (GPU GEMM tuning, cubins in the plan),
   then the plan run by the GPU executor against onnxruntime on the CPU (fp32, 1e-4 relative); and
   fp16 / bf16 plans of a generated encoder against its fp32 plan (bench/gpu_precision.py, issue #6);
6. writes JSON to $OUT (if set), else bench/results/, named with the date and the GPU, and
   prints a short table last.
--quick checks one variant per family and times fewer shapes (about a minute).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DECODE_M = (1, 2, 4, 8, 16, 32, 64)
DECODE_NK = ((4096, 4096), (11008, 4096), (4096, 11008), (576, 576), (1536, 576))
PREFILL_M = (512, 2048, 4096)
SQUARE = 4096
COPY_ELEMS = 2**28            # 1 GiB of float32 for the copy ceiling
CEILING_SIZE = 8192           # square matrix products for the cuBLAS ceilings and the warm-up
L2_BYTES = 60 * 2**20
BIG_WEIGHT_BYTES = 32 * 2**20
# What a run can do, in order; --sections picks some (a short device lease re-measures one part).
SECTIONS = ("correctness", "e2e", "precision", "serve", "decode", "prefill", "square")
SECTION_FAMILIES = {"decode": ("skinny", "skinny_int8"), "prefill": ("mma",), "square": ("mma", "simt")}
GOALS = {"decode_speedup": 1.2, "decode_bw_pct": 80.0, "mma_vs_cublas": 0.55, "simt_vs_sgemm": 0.8, "e2e_rel_err": 1e-4,
         "precision_speedup": 1.5, "int8_vs_bf16": 1.7}
INT8_GOAL_ELEMS = 4096 * 11008
E2E_MODELS = ("tests/models/cnn_ts.onnx", "tests/models/bert_ts.onnx", "tests/models/gpt2_ts.onnx",
              "tests/models/llama_ts.onnx", "tests/models/cnn_dynamo.onnx")


def import_infc() -> None:
    """The repository root is the package `infc`; without an install, expose it under that name."""
    try:
        import infc.compiler.codegen  # noqa: F401, PLC0415
    except ImportError:
        link_dir = Path(tempfile.mkdtemp(prefix="infc-path-"))
        (link_dir / "infc").symlink_to(ROOT, target_is_directory=True)
        sys.path.insert(0, str(link_dir))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Check and time the generated GEMM kernels on a GPU.")
    parser.add_argument("--quick", action="store_true", help="one variant per family, fewer shapes")
    parser.add_argument("--out", type=Path, help="JSON folder (default: $OUT if set, else bench/results)")
    parser.add_argument("--cubins", type=Path, default=ROOT / "cache" / "cubins", help="cubin cache folder")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="parallel nvcc processes")
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip timing sections after this many seconds")
    parser.add_argument("--seed", type=int, help="input seed (default: fresh, recorded in the JSON)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {','.join(SECTIONS)} (default: all); 'correctness' checks "
                             "the variants of the families the other chosen sections time")
    parser.add_argument("--families", help="comma-separated families to check (default: those the sections time)")
    args = parser.parse_args(argv)
    args.sections = [name for name in args.sections.split(",") if name]
    unknown = sorted(set(args.sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    return args


def result_path(args: argparse.Namespace, date: str, gpu: str) -> Path:
    folder = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "bench" / "results")
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-").lower() or "gpu"
    return folder / f"gpu_check-{date}-{slug}.json"


# ---- what runs ------------------------------------------------------------------------------------

def check_shapes(variant, quick: bool) -> list[tuple[int, int, int]]:
    """(M, N, K) per variant: tails in every dimension the family allows, then an aligned shape."""
    family = variant.family
    if family == "simt":
        shapes = [(257, 382, 131), (256, 256, 256)]
    elif family == "mma":
        shapes = [(300, 262, 264), (256, 512, 512)]
    else:
        rows = 8 * variant.params["MT"]
        shapes = [(rows - 3, 1030, 1000), (1, 576, 576), (rows, 4106, 1032)]
    return shapes[:1] if quick else shapes


def selected_variants(variants, quick: bool):
    if not quick:
        return list(variants)
    seen, chosen = set(), []
    for v in variants:  # first of each family and dtype, plus the heaviest epilogue of each family
        key = (v.family, v.dtype)
        if key not in seen or (v.epilogue.swiglu and v.epilogue.residual and (v.family, "heavy") not in seen):
            seen.add(key if key not in seen else (v.family, "heavy"))
            chosen.append(v)
    return chosen


def is_plain(variant) -> bool:
    e = variant.epilogue
    return not (e.bias or e.residual or e.swiglu or e.act != "none") and variant.out_dtype == variant.dtype


def timing_candidates(variants, family: str, M: int, dtype: str = "bfloat16"):
    """Plain-epilogue variants of `family` that can run M rows (the tiles the tuner chooses from)."""
    return [v for v in variants if v.family == family and v.dtype == dtype and is_plain(v)
            and not (family.startswith("skinny") and M > 8 * v.params["MT"])]


def split_candidates(auto: int) -> list[int]:
    """Split-K counts to time around the default one (the tuner's search, in small)."""
    return sorted({1, max(1, auto // 2), auto, 2 * auto})


def rotations(bytes_per_call: int, cap: int = 64) -> int:
    """Buffer sets to rotate over so that a timed batch streams from memory, not from L2."""
    return max(1, min(cap, math.ceil(3 * L2_BYTES / max(1, bytes_per_call))))


# ---- results --------------------------------------------------------------------------------------

def geomean(values) -> float | None:
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summarize(results: dict) -> dict:
    """Acceptance lines from the raw results (pure: tested with fake numbers on the CPU)."""
    checks = results.get("correctness", [])
    failed = sorted({c["variant"] for c in checks if not c["ok"]})
    decode = [d for d in results.get("decode", []) if d["M"] <= 16 and d.get("speedup")]
    big = [d["bw_pct"] for d in decode if d["weight_bytes"] >= BIG_WEIGHT_BYTES and d.get("bw_pct")]
    square = results.get("square", {})
    # issue #6: the int8 GEMV at M = 1 against the faster bf16 path (cuBLAS or ours) on the 4096 x 11008 weights
    int8_m1 = [min(d["cublas_us"], d["ours_us"]) / d["int8"]["us"] for d in decode
               if d["M"] == 1 and d["N"] * d["K"] == INT8_GOAL_ELEMS and d.get("int8") and d.get("cublas_us")]
    summary = {
        "variants_checked": len({c["variant"] for c in checks}),
        "variants_failed": failed,
        "decode_speedup_geomean": geomean(d["speedup"] for d in decode),
        "decode_bw_pct_min_big": min(big) if big else None,
        "prefill_vs_cublas_geomean": geomean(d.get("vs_cublas") for d in results.get("prefill", [])),
        "mma_vs_cublas_4096": square.get("mma_vs_cublas"),
        "simt_vs_sgemm_4096": square.get("simt_vs_sgemm"),
        "e2e_models_ok": sum(1 for e in results.get("end_to_end", []) if e.get("ok")),
        "e2e_models": len(results.get("end_to_end", [])),
        "precision_speedup": (results.get("precision_speed") or {}).get("speedup"),
        "int8_vs_best_bf16_m1": min(int8_m1) if int8_m1 else None,
        "serve": [{k: r.get(k) for k in ("model", "greedy_agreement", "tpot_ms_cpu_over_gpu", "output_tok_s_gpu_over_cpu")}
                  for r in results.get("serve", []) if "greedy_agreement" in r],
    }
    precision = results.get("precision_speed") or {}
    summary["pass"] = {
        "correct": bool(checks) and not failed,
        "decode_speedup": (summary["decode_speedup_geomean"] or 0) >= GOALS["decode_speedup"],
        "decode_bw": (summary["decode_bw_pct_min_big"] or 0) >= GOALS["decode_bw_pct"],
        "mma": (summary["mma_vs_cublas_4096"] or 0) >= GOALS["mma_vs_cublas"],
        "simt": (summary["simt_vs_sgemm_4096"] or 0) >= GOALS["simt_vs_sgemm"],
        "int8": (summary["int8_vs_best_bf16_m1"] or 0) >= GOALS["int8_vs_bf16"],
        "e2e": bool(summary["e2e_models"]) and summary["e2e_models_ok"] == summary["e2e_models"],
        "precision": bool(precision.get("speedup")) and all(r.get("ok") for r in precision.get("plans", {}).values())
        and all((v or 0) >= GOALS["precision_speedup"] for v in precision["speedup"].values()),
    }
    return summary


def _fmt(value, spec: str = ".2f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def format_table(results: dict) -> str:
    s, c = results["summary"], results.get("ceilings", {})
    lines = [f"gpu_check  {results.get('device', {}).get('name', '?')}  {results.get('date', '')}"
             f"{'  (quick)' if results.get('quick') else ''}"]
    lines.append(f"ceilings   copy {_fmt(c.get('copy_tb_s'))} TB/s   cuBLAS bf16 {_fmt(c.get('bf16_tflops'), '.0f')} "
                 f"TFLOP/s   fp32 {_fmt(c.get('fp32_tflops'), '.1f')} TFLOP/s   read {_fmt(c.get('read_tb_s'))} TB/s   "
                 f"launch {_fmt(c.get('launch_floor_us'), '.1f')} us")
    lines.append(f"{'decode M x N x K':22s} {'ours us':>8s} {'cuBLAS':>8s} {'x':>6s} {'%copy':>6s}  best")
    for d in results.get("decode", []):
        if d["M"] in (1, 16, 64):
            lines.append(f"{d['M']:>4d} x {d['N']:>5d} x {d['K']:>5d}    {_fmt(d.get('ours_us'), '8.1f'):>8s} "
                         f"{_fmt(d.get('cublas_us'), '8.1f'):>8s} {_fmt(d.get('speedup'), '6.2f'):>6s} "
                         f"{_fmt(d.get('bw_pct'), '6.0f'):>6s}  {d.get('ours', '-')}")
    p = s["pass"]
    lines += [
        f"correct         {s['variants_checked'] - len(s['variants_failed'])}/{s['variants_checked']} variants"
        f"{'' if not s['variants_failed'] else '  FAILED: ' + ', '.join(s['variants_failed'][:4])}",
        f"decode M<=16    {_fmt(s['decode_speedup_geomean'])}x cuBLAS geomean (goal {GOALS['decode_speedup']})"
        f"  {'ok' if p['decode_speedup'] else 'MISS'}",
        f"decode >=32MB   {_fmt(s['decode_bw_pct_min_big'], '.0f')}% of copy bandwidth, worst"
        f" (goal {GOALS['decode_bw_pct']:.0f})  {'ok' if p['decode_bw'] else 'MISS'}",
        f"prefill bf16    {_fmt(s['prefill_vs_cublas_geomean'])}x cuBLAS geomean (M 512..4096, mma tiles)",
        f"end to end      {s.get('e2e_models_ok', 0)}/{s.get('e2e_models', 0)} models match onnxruntime (fp32"
        f" {GOALS['e2e_rel_err']:.0e}): " + ", ".join(f"{Path(e['model']).stem} {_fmt(e.get('max_rel_err'), '.1e')}"
                                                   for e in results.get("end_to_end", [])) + f"  {'ok' if p.get('e2e') else 'MISS'}",
        f"mma 4096^3      {_fmt(s['mma_vs_cublas_4096'])}x cuBLAS bf16 (goal {GOALS['mma_vs_cublas']})"
        f"  {'ok' if p['mma'] else 'MISS'}",
        f"simt 4096^3     {_fmt(s['simt_vs_sgemm_4096'])}x cuBLAS SGEMM (goal {GOALS['simt_vs_sgemm']})"
        f"  {'ok' if p['simt'] else 'MISS'}",
        f"int8 GEMV M=1   {_fmt(s.get('int8_vs_best_bf16_m1'))}x the best bf16 path, 4096 x 11008 (goal "
        f"{GOALS['int8_vs_bf16']})  {'ok' if p.get('int8') else 'MISS'}",
        "fp16/bf16 plan  " + "  ".join(f"{k} {_fmt(v)}x" for k, v in (s.get("precision_speedup") or {}).items())
        + f" the fp32 plan's speed (encoder, goal {GOALS['precision_speedup']})  {'ok' if p.get('precision') else 'MISS'}",
        "decode on GPU   " + ("  ".join(f"{Path(r['model']).stem}: tokens {_fmt(r['greedy_agreement'])} as the CPU plan's, "
                                        f"TPOT {_fmt(r['tpot_ms_cpu_over_gpu'], '.1f')}x faster"
                                        for r in s.get("serve", [])) or "-"),
    ]
    return "\n".join(lines)


def write_json(results: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1, sort_keys=True, default=str))
    tmp.replace(path)
    return path


# ---- device work (needs CuPy and a GPU) -----------------------------------------------------------

class Device:
    """CuPy, optional torch, the loaded kernels and the timing helpers."""

    def __init__(self, args):
        import cupy  # noqa: PLC0415

        self.cp, self.args = cupy, args
        try:
            import torch  # noqa: PLC0415

            self.torch = torch if torch.cuda.is_available() else None
        except ImportError:
            self.torch = None
        props = cupy.cuda.runtime.getDeviceProperties(0)
        self.num_sms = props["multiProcessorCount"]
        self.info = {"name": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
                     "sms": self.num_sms, "l2_bytes": props.get("l2CacheSize"),
                     "cc": f"{props['major']}.{props['minor']}", "driver": cupy.cuda.runtime.driverGetVersion(),
                     "runtime": cupy.cuda.runtime.runtimeGetVersion(), "cupy": cupy.__version__,
                     "torch": getattr(self.torch, "__version__", None)}
        self.modes = collections.Counter()  # how the timings were taken

    def sync(self) -> None:
        self.cp.cuda.runtime.deviceSynchronize()

    def bench(self, fn, num_rot: int = 1, samples: int = 25, warmup: int = 3, capture: str | None = "cupy") -> float:
        """Median seconds per call; call i uses buffer set i % num_rot. Short calls are captured in a
        CUDA graph (CuPy's, or torch's for torch calls) of enough calls to hide launch overhead, so
        the Python launch path is not what gets timed; the graph's replays are timed with events."""
        for i in range(warmup):
            fn(i % num_rot)
        self.sync()
        t0 = time.perf_counter()
        for i in range(num_rot):
            fn(i)
        self.sync()
        estimate = (time.perf_counter() - t0) / num_rot  # an upper bound: host time included
        calls = num_rot * max(1, math.ceil(min(2e-3 / max(estimate, 1e-7), 512) / num_rot))
        replay = None
        if capture and estimate < 500e-6:
            try:
                replay = (self._capture_torch if capture == "torch" else self._capture_cupy)(fn, num_rot, calls)
            except Exception as error:  # noqa: BLE001 - not capturable: time it eagerly
                self.modes[f"eager ({type(error).__name__})"] += 1
        if replay is None:
            calls = num_rot
            replay = self._eager(fn, num_rot)
        else:
            self.modes[f"graph ({capture})"] += 1
        times = [replay() / calls for _ in range(samples)]
        return statistics.median(times)

    def _eager(self, fn, num_rot: int):
        start, end = self.cp.cuda.Event(), self.cp.cuda.Event()

        def replay() -> float:
            start.record()
            for i in range(num_rot):
                fn(i)
            end.record()
            end.synchronize()
            return self.cp.cuda.get_elapsed_time(start, end) * 1e-3
        return replay

    def _capture_cupy(self, fn, num_rot: int, calls: int):
        cp = self.cp
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            fn(0)  # first use on this stream outside the capture (allocations, handles)
            stream.synchronize()
            stream.begin_capture()
            try:
                for i in range(calls):
                    fn(i % num_rot)
            finally:
                graph = stream.end_capture()
        start, end = cp.cuda.Event(), cp.cuda.Event()

        def replay() -> float:
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            return cp.cuda.get_elapsed_time(start, end) * 1e-3
        return replay

    def _capture_torch(self, fn, num_rot: int, calls: int):
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(3):
                fn(i % num_rot)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(calls):
                fn(i % num_rot)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def replay() -> float:
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e-3
        return replay

    def random_bits(self, shape, dtype: str, scale: float = 1.0):
        from infc.compiler.codegen.prepack import to_bits  # noqa: PLC0415

        x = self.cp.random.standard_normal(shape, dtype=self.cp.float32) * np.float32(scale)
        return to_bits(x, dtype, xp=self.cp)

    def as_torch(self, bits, dtype: str):
        if dtype == "float32":
            return self.torch.from_dlpack(bits)
        t = self.torch.from_dlpack(bits.view(self.cp.int16))  # int16: the 16-bit type every torch has
        return t.view(self.torch.bfloat16 if dtype == "bfloat16" else self.torch.float16)

    def cublas_calls(self, a, w, out, dtype: str) -> dict:
        """out = a @ w^T through each available cuBLAS path, by name."""
        cp, calls = self.cp, {}
        if dtype == "float32":
            calls["cupy_f32"] = lambda: cp.matmul(a, w.T, out=out)
        else:
            if dtype == "float16":
                a16, w16, o16 = (x.view(cp.float16) for x in (a, w, out))
                calls["cupy_f16"] = lambda: cp.matmul(a16, w16.T, out=o16)
            else:
                try:
                    import ml_dtypes  # noqa: PLC0415

                    ab, wb, ob = (x.view(ml_dtypes.bfloat16) for x in (a, w, out))
                    calls["cupy_bf16"] = lambda: cp.matmul(ab, wb.T, out=ob)
                except Exception:  # noqa: BLE001 - CuPy without bfloat16
                    pass
            if self.torch is not None:
                at, wt, ot = (self.as_torch(x, dtype) for x in (a, w, out))
                calls[f"torch_{'bf16' if dtype == 'bfloat16' else 'f16'}"] = lambda: self.torch.mm(at, wt.t(), out=ot)
        return calls

    def time_cublas(self, sets, dtype: str, samples: int = 25) -> dict:
        """Median seconds per call of every working cuBLAS path over rotating (a, w, out) sets."""
        timings = {}
        per_set = [self.cublas_calls(a, w, out, dtype) for a, w, out in sets]
        for name in per_set[0]:
            try:
                capture = "torch" if name.startswith("torch") else "cupy"
                timings[name] = self.bench(lambda i: per_set[i % len(sets)][name](), len(sets), samples,
                                           capture=capture)
            except Exception as error:  # noqa: BLE001 - a path CuPy or torch lacks
                timings[name] = None
                print(f"  cuBLAS path {name} unavailable: {str(error).splitlines()[0][:120]}")
        return timings


def compile_all(variants, args) -> tuple[dict, dict]:
    from infc.compiler.codegen.cache import CubinCache  # noqa: PLC0415
    from infc.compiler.codegen.compile import CompileError, compile_variants  # noqa: PLC0415

    start = time.perf_counter()
    compiled = compile_variants(variants, CubinCache(args.cubins), workers=args.workers)
    errors = {name: str(r)[-600:] for name, r in compiled.items() if isinstance(r, CompileError)}
    spills = [name for name, r in compiled.items() if not isinstance(r, CompileError) and r.resources.has_spills]
    report = {"variants": len(compiled), "seconds": round(time.perf_counter() - start, 1),
              "errors": errors, "spills": spills}
    return {n: r for n, r in compiled.items() if n not in errors}, report


SASS_PATTERNS = {"hmma": r"\bHMMA\.", "ldsm": r"\bLDSM\.", "ldgsts": r"\bLDGSTS\.", "ldg128": r"\bLDG\.E[.A-Z0-9_]*\.128\b",
                 "local": r"\b(LDL|STL)\b", "ffma": r"\bFFMA\b"}


def sass_summary(compiled: dict, names) -> dict:
    """Instruction counts from cuobjdump (on the device image, not on the dev machines): are the
    matrix instructions and 16-byte loads there, and no local memory."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        return {"error": "cuobjdump not found"}
    summary = {}
    for name in names:
        if name in compiled:
            sass = subprocess.run([tool, "--dump-sass", str(compiled[name].cubin)], capture_output=True,
                                  text=True).stdout
            summary[name] = {key: len(re.findall(pattern, sass)) for key, pattern in SASS_PATTERNS.items()}
    return summary


def measure_ceilings(dev: Device) -> dict:
    cp = dev.cp
    n = COPY_ELEMS
    src, dst = cp.ones(n, dtype=cp.float32), cp.empty(n, dtype=cp.float32)
    t_copy = dev.bench(lambda i: cp.copyto(dst, src), 1, samples=10, capture=None)
    # A read-only stream (what a GEMV's weights are) and the time of one tiny launch in a graph of
    # many (what every decode GEMM pays on top of its bytes): what the decode numbers are measured against.
    total = cp.empty((), dtype=cp.float32)
    t_read = dev.bench(lambda i: cp.sum(src, out=total), 1, samples=10, capture=None)
    tiny_src, tiny_dst = cp.ones(32, dtype=cp.float32), cp.empty(32, dtype=cp.float32)
    t_launch = dev.bench(lambda i: cp.copyto(tiny_dst, tiny_src), 1, samples=10)
    src = dst = None  # free the 2 GiB before the matrix products
    size = CEILING_SIZE
    a32 = cp.random.standard_normal((size, size), dtype=cp.float32)
    w32 = cp.random.standard_normal((size, size), dtype=cp.float32)
    o32 = cp.empty((size, size), dtype=cp.float32)
    flops = 2.0 * size**3
    t32 = dev.bench(lambda i: cp.matmul(a32, w32.T, out=o32), 1, samples=5, warmup=2, capture=None)
    bf = [dev.random_bits((size, size), "bfloat16") for _ in range(3)]
    t16 = dev.time_cublas([tuple(bf)], "bfloat16", samples=5)
    best16 = min((t for t in t16.values() if t), default=None)
    return {"copy_tb_s": 2 * n * 4 / t_copy / 1e12, "read_tb_s": n * 4 / t_read / 1e12,
            "launch_floor_us": t_launch * 1e6, "fp32_tflops": flops / t32 / 1e12,
            "bf16_tflops": flops / best16 / 1e12 if best16 else None,
            "bf16_paths_tflops": {k: (flops / t / 1e12 if t else None) for k, t in t16.items()}}


def check_variant(dev: Device, variant, kernel, shape, rng) -> dict:
    from infc.compiler.codegen.problems import make_problem  # noqa: PLC0415
    from infc.compiler.codegen.reference import relative_error  # noqa: PLC0415

    cp = dev.cp
    problem = make_problem(variant, *shape, rng)
    arrays = {k: cp.asarray(v) for k, v in problem.arrays.items()}
    extra = {k: arrays.get(k) for k in ("bias", "scale", "residual")}

    def run(M, a, residual):
        flat = problem.output_buffer(xp=cp)
        kernel(a, arrays["w"], flat, M, problem.N, problem.K, **{**extra, "residual": residual})
        dev.sync()
        return flat

    flat = run(problem.M, arrays["a"], extra["residual"])
    out = cp.asnumpy(problem.output_view(flat))
    ref = cp.asnumpy(problem.reference(xp=cp))
    decoded = problem.decode(out)
    err = relative_error(decoded, ref)
    record = {"variant": variant.name, "shape": list(shape), "rel_err": err, "tol": problem.tolerance,
              "unwritten": int(np.isnan(decoded).sum()), "guard_ok": problem.guard_intact(flat, xp=cp)}
    if variant.family.startswith("skinny"):
        again = cp.asnumpy(problem.output_view(run(problem.M, arrays["a"], extra["residual"])))
        record["deterministic"] = bool(np.array_equal(again, out))
        n_out = problem.out_shape[1]
        res1 = None if extra["residual"] is None else extra["residual"][:n_out]
        one = cp.asnumpy(run(1, arrays["a"][:1], res1)[:n_out])
        record["batch_invariant"] = bool(np.array_equal(one, out[0]))
    record["ok"] = bool(err <= problem.tolerance and record["guard_ok"] and record.get("deterministic", True))
    return record


def time_decode(dev: Device, kernels: dict, variants, M: int, N: int, K: int, copy_tb_s: float) -> dict:
    from infc.compiler.codegen.prepack import pack_skinny, quantize_int8, to_bits  # noqa: PLC0415

    cp = dev.cp
    w_bytes = N * K * 2
    num_rot = rotations(w_bytes)
    w_logical = cp.random.standard_normal((N, K), dtype=cp.float32) / np.float32(math.sqrt(K))
    dense = [to_bits(w_logical, "bfloat16", xp=cp) for _ in range(num_rot)]
    acts = [dev.random_bits((M, K), "bfloat16") for _ in range(num_rot)]
    out = cp.empty((M, N), dtype=cp.uint16)
    cublas = dev.time_cublas([(acts[i], dense[i], out) for i in range(num_rot)], "bfloat16")
    record = {"M": M, "N": N, "K": K, "weight_bytes": w_bytes, "rotations": num_rot, "cublas": cublas, "ours_all": {}}
    packed = {}
    for v in timing_candidates(variants, "skinny", M):
        if v.name not in kernels:
            continue
        nw = v.params["NW"]
        if nw not in packed:
            packed[nw] = [pack_skinny(w_logical, nw, "bfloat16", xp=cp) for _ in range(num_rot)]
        k, p = kernels[v.name], packed[nw]
        for splits in split_candidates(k.launch_for(M, N, K).num_splits):
            name = f"{v.name}/s{k.launch_for(M, N, K, splits).num_splits}"
            timing = _time_candidate(dev, record, name, lambda i: k(acts[i], p[i], out, M, N, K, num_splits=splits),
                                     num_rot)
            if timing is not None:
                record["ours_all"][name] = timing
    q, scale = quantize_int8(w_logical, xp=cp)
    int8 = {}
    for v in timing_candidates(variants, "skinny_int8", M):
        if v.name in kernels:
            pq = [pack_skinny(q, v.params["NW"], "int8", xp=cp) for _ in range(rotations(N * K))]
            k = kernels[v.name]
            for splits in split_candidates(k.launch_for(M, N, K).num_splits):  # as for bf16 above
                name = f"{v.name}/s{k.launch_for(M, N, K, splits).num_splits}"
                timing = _time_candidate(dev, record, name, lambda i: k(acts[i % num_rot], pq[i], out, M, N, K,
                                                                        scale=scale, num_splits=splits), len(pq))
                if timing is not None:
                    int8[name] = timing
    best_cublas = min((t for t in cublas.values() if t), default=None)
    pct_of_copy = (lambda nbytes, t: 100 * nbytes / t / (copy_tb_s * 1e12) if copy_tb_s else None)
    if record["ours_all"]:
        name, t = min(record["ours_all"].items(), key=lambda kv: kv[1])
        record.update(ours=name, ours_us=t * 1e6, bw_pct=pct_of_copy(w_bytes, t))
        if best_cublas:
            record.update(cublas_us=best_cublas * 1e6, speedup=best_cublas / t)
    if int8:
        name, t = min(int8.items(), key=lambda kv: kv[1])
        record["int8"] = {"best": name, "us": t * 1e6, "bw_pct": pct_of_copy(N * K, t),
                          "speedup_vs_cublas_bf16": (best_cublas / t) if best_cublas else None}
    return record


def _time_candidate(dev: Device, record: dict, name: str, fn, num_rot: int) -> float | None:
    """dev.bench(fn), or None with the error under record["failed"][name]: one candidate that cannot launch
    (a resource limit, say) leaves the shape's other candidates timed."""
    try:
        return dev.bench(fn, num_rot)
    except Exception as error:  # noqa: BLE001 - recorded; a sticky CUDA error fails the next candidates too
        record.setdefault("failed", {})[name] = repr(error)[:200]
        return None


def time_dense(dev: Device, kernels: dict, variants, M: int, N: int, K: int, dtype: str, samples: int = 10) -> dict:
    cp = dev.cp
    family = "simt" if dtype == "float32" else "mma"
    item = 4 if dtype == "float32" else 2
    num_rot = rotations((M * K + N * K + M * N) * item)
    sets = [(dev.random_bits((M, K), dtype), dev.random_bits((N, K), dtype, 1 / math.sqrt(K)),
             cp.empty((M, N), dtype=cp.float32 if dtype == "float32" else cp.uint16)) for _ in range(num_rot)]
    cublas = dev.time_cublas(sets, dtype, samples)
    ours = {}
    for v in timing_candidates(variants, family, M, dtype):
        if v.name in kernels:
            k = kernels[v.name]
            ours[v.name] = dev.bench(lambda i: k(sets[i][0], sets[i][1], sets[i][2], M, N, K), num_rot, samples)
    flops = 2.0 * M * N * K
    best_cublas = min((t for t in cublas.values() if t), default=None)
    record = {"M": M, "N": N, "K": K, "dtype": dtype, "cublas": cublas,
              "ours_all": {k: flops / t / 1e12 for k, t in ours.items()}}
    if ours:
        name, t = min(ours.items(), key=lambda kv: kv[1])
        record.update(ours=name, ours_tflops=flops / t / 1e12,
                      cublas_tflops=flops / best_cublas / 1e12 if best_cublas else None,
                      vs_cublas=best_cublas / t if best_cublas else None)
    return record


def end_to_end(args, seed: int, models=E2E_MODELS) -> list[dict]:
    """`infc build --target cuda` of each test model, then its plan on the GPU against onnxruntime on
    the CPU: the largest relative error per model, where each step ran, the tuning choices, latency."""
    from infc.compiler.build import BuildOptions, build  # noqa: PLC0415
    from infc.compiler.model_io import load_model  # noqa: PLC0415
    from infc.compiler.runtime.feeds_io import random_plan_feeds  # noqa: PLC0415
    from infc.compiler.runtime.session import PlanSession  # noqa: PLC0415
    from infc.compiler.verify import ort_session  # noqa: PLC0415

    records = []
    with tempfile.TemporaryDirectory(prefix="infc-e2e-") as tmp:
        for model in models:
            record, plan = {"model": model}, Path(tmp) / (Path(model).stem + ".plan")
            try:
                start = time.perf_counter()
                report = build(str(ROOT / model), None, str(plan), BuildOptions(
                    target="cuda", use_cache=False, cache_dir=args.cubins.parent, show_progress=False), print)
                record["build_s"] = round(time.perf_counter() - start, 2)
                record["tuning"] = [{k: row.get(k) for k in ("shape", "winner", "winner_pct_of_vendor", "winner_tflops")}
                                    for row in report.get("tuning", [])]
                session = PlanSession(plan)
                feeds = session.check_feeds(random_plan_feeds(session, seed), "random inputs")
                names = session.output_names
                expected = ort_session(load_model(ROOT / model)).run(names, feeds)
                actual = session.run(feeds)
                errors = [float(np.abs(actual[n].astype(np.float64) - e).max() / max(np.abs(e).max(), 1e-30))
                          for n, e in zip(names, expected)]
                record["max_rel_err"] = max(errors)
                record["self_check"] = report.get("cuda_self_check")
                record["host_fallback_ops"] = session.executor.report()["host_fallback_ops"]
                record["ok"] = bool(record["max_rel_err"] <= GOALS["e2e_rel_err"]) and not record["host_fallback_ops"]
                times = []
                for _ in range(20):  # host clock: the outputs are copied back, so the device is done
                    begin = time.perf_counter()
                    session.run(feeds)
                    times.append(time.perf_counter() - begin)
                record["latency_ms_median"] = statistics.median(times[5:]) * 1e3
                record["executor"] = session.executor.report()
            except Exception:  # noqa: BLE001 - record it; the kernel checks stand on their own
                record.update(ok=False, error=traceback.format_exc()[-1500:])
            print(f"  end to end {model}: {'ok' if record.get('ok') else 'FAIL'} "
                  f"max rel err {record.get('max_rel_err')} {record.get('error', '')[-300:]}")
            records.append(record)
    return records


def precision_speed(args) -> dict:
    """Issue #6 on the GPU: fp16 and bf16 plans of one encoder against its fp32 plan (bench/gpu_precision.py)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_precision import precision_speed as measure  # noqa: PLC0415

    sizes = {"layers": 1, "hidden": 256, "heads": 4, "ffn": 1024, "batch": 4, "seq": 128} if args.quick else {}
    try:
        with tempfile.TemporaryDirectory(prefix="infc-precision-") as tmp:
            return measure(Path(tmp), args.cubins.parent, **sizes)
    except Exception:  # noqa: BLE001 - record it; the kernel checks stand on their own
        return {"error": traceback.format_exc()[-1500:]}


def decode_serving(args) -> list[dict]:
    """Decoder plans on the GPU: the engine serving the same greedy requests from a cuda and a cpu plan
    (bench/gpu_decode.py): token agreement, TPOT / TTFT / throughput ratios."""
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_decode import measure  # noqa: PLC0415

    sizes = {"requests": 4, "input_len": 32, "output_len": 16} if args.quick else {}
    try:
        with tempfile.TemporaryDirectory(prefix="infc-serve-") as tmp:
            return measure(Path(tmp), args.cubins.parent, **sizes)
    except Exception:  # noqa: BLE001 - record it; the kernel checks stand on their own
        return [{"error": traceback.format_exc()[-1500:]}]


def run_device(args, results: dict, started: float) -> None:
    import_infc()
    from infc.compiler.codegen.variants import VARIANTS  # noqa: PLC0415
    from infc.compiler.runtime.cuda.launcher import GemmKernel  # noqa: PLC0415

    dev = Device(args)
    results["device"] = dev.info
    variants = selected_variants(VARIANTS, args.quick)
    timed = [v for v in VARIANTS if is_plain(v)]
    compiled, results["compile"] = compile_all([v for v in VARIANTS if v in variants or v in timed], args)
    print(f"compiled {results['compile']['variants']} variants in {results['compile']['seconds']} s, "
          f"{len(results['compile']['errors'])} errors, spills: {results['compile']['spills'] or 'none'}")
    first_of_family = {v.family: v.name for v in reversed(VARIANTS) if is_plain(v)}
    results["sass"] = sass_summary(compiled, sorted(first_of_family.values()))
    kernels = {}
    for v in VARIANTS:
        if v.name in compiled:
            kernels[v.name] = GemmKernel(compiled[v.name].cubin, compiled[v.name].name, v.params, dev.num_sms)

    warm = dev.cp.random.standard_normal((CEILING_SIZE, CEILING_SIZE), dtype=dev.cp.float32)
    for _ in range(20):  # clocks idle low: warm up before measuring
        dev.cp.matmul(warm, warm)
    dev.sync()
    del warm
    try:
        results["ceilings"] = measure_ceilings(dev)
    except Exception as error:  # noqa: BLE001 - the kernels can still be checked and timed
        results["ceilings"] = {"error": repr(error)[:300]}
    print(f"ceilings: {results['ceilings']}")

    rng = np.random.default_rng(args.seed)
    sections = set(args.sections)
    timed_families = {f for name in sections for f in SECTION_FAMILIES.get(name, ())}
    # by default every family when everything runs (or no timed section does), else the timed ones
    families = set(args.families.split(",")) if args.families else (
        timed_families if sections != set(SECTIONS) and timed_families else {v.family for v in variants})
    for v in (variants if "correctness" in sections else []):
        if v.family not in families:
            continue
        for shape in check_shapes(v, args.quick):
            try:
                record = check_variant(dev, v, kernels[v.name], shape, rng) if v.name in kernels else \
                    {"variant": v.name, "shape": list(shape), "ok": False, "error": "did not compile"}
            except Exception as error:  # noqa: BLE001 - record and go on; a sticky CUDA error fails the rest
                record = {"variant": v.name, "shape": list(shape), "ok": False, "error": repr(error)[:300]}
            results["correctness"].append(record)
            if not record["ok"]:
                print(f"  FAIL {v.name} {shape}: {record.get('error') or record.get('rel_err')}")
    print(f"checked {len(results['correctness'])} variant x shape pairs")
    if "e2e" in sections:
        results["end_to_end"] = end_to_end(args, int(rng.integers(1 << 31)))
    if "precision" in sections:
        results["precision_speed"] = precision_speed(args)
    if "serve" in sections:
        results["serve"] = decode_serving(args)

    copy = results["ceilings"].get("copy_tb_s")
    ms = (1, 16) if args.quick else DECODE_M
    nks = DECODE_NK[:1] + DECODE_NK[3:4] if args.quick else DECODE_NK
    for M in (ms if "decode" in sections else ()):
        for N, K in nks:
            base = {"M": M, "N": N, "K": K, "weight_bytes": N * K * 2}
            timed_section(results, "decode", base, started, args,
                          lambda: time_decode(dev, kernels, timed, M, N, K, copy))
    for M in ((PREFILL_M[1:2] if args.quick else PREFILL_M) if "prefill" in sections else ()):
        for N, K in (DECODE_NK[:1] if args.quick else DECODE_NK):
            timed_section(results, "prefill", {"M": M, "N": N, "K": K}, started, args,
                          lambda: time_dense(dev, kernels, timed, M, N, K, "bfloat16"))
    results["timing_modes"] = dict(dev.modes)
    if "square" in sections:
        square = {"M": SQUARE, "N": SQUARE, "K": SQUARE}
        for key, dtype, samples in (("mma", "bfloat16", 10), ("simt", "float32", 5)):  # past the budget too
            timed_section(results, key, square, None, args,
                          lambda: time_dense(dev, kernels, timed, SQUARE, SQUARE, SQUARE, dtype, samples))
        results["timing_modes"] = dict(dev.modes)
        mma, simt = results.pop("mma")[0], results.pop("simt")[0]
        results["square"] = {"mma": mma, "simt": simt, "mma_vs_cublas": mma.get("vs_cublas"),
                             "simt_vs_sgemm": simt.get("vs_cublas")}


def timed_section(results: dict, key: str, base: dict, started: float | None, args, measure) -> None:
    """Appends measure()'s record to results[key]; past the time budget or on an error, says so."""
    label = f"{key} {base['M']}x{base['N']}x{base['K']}"
    if started is not None and time.perf_counter() - started > args.budget_s:
        results["skipped"].append(label)
        return
    try:
        record = measure()
    except Exception as error:  # noqa: BLE001 - keep the other measurements
        record = {**base, "error": repr(error)[:300]}
        print(f"  {label}: {record['error']}")
    results.setdefault(key, []).append(record)


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    date = datetime.date.today().isoformat()
    results = {"tool": "bench/gpu_check.py", "date": date, "quick": args.quick, "seed": args.seed, "sections": args.sections,
               "correctness": [], "decode": [], "prefill": [], "square": {}, "skipped": []}
    try:
        import cupy  # noqa: F401, PLC0415

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
    except Exception as error:  # noqa: BLE001 - ImportError, CUDARuntimeError, ...
        print(f"error: gpu_check needs CuPy and a CUDA device ({str(error).splitlines()[0][:160]})", file=sys.stderr)
        return 2
    try:
        run_device(args, results, started)
    except Exception:  # noqa: BLE001 - still write what was measured
        results["error"] = traceback.format_exc()[-2000:]
        print(results["error"], file=sys.stderr)
    results["elapsed_s"] = round(time.perf_counter() - started, 1)
    results["summary"] = summarize(results)
    path = write_json(results, result_path(args, date, results.get("device", {}).get("name", "gpu")))
    print(f"wrote {path}")
    print(format_table(results))
    return 0 if "error" not in results else 1


if __name__ == "__main__":
    sys.exit(main())
