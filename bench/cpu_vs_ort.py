"""infc plan vs onnxruntime on the CPU, side by side in one run: for every test model the same
inputs go through an infc plan and an onnxruntime session (ORT_ENABLE_ALL); p50 latency of both
and their ratio, then the geometric mean.

    python bench/cpu_vs_ort.py [--iterations N] [--models SUBSTR ...] [--keep-openblas-env] [--tag TAG] [--no-write]

OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE slow NumPy's BLAS on these machines; unless
--keep-openblas-env is given, this script re-runs itself once with both unset (and says so), so
both runtimes get the machine's real BLAS kernels. Results: bench/results/cpu_vs_ort[-TAG]-<date>.json
and the top of docs/cpu-vs-ort.md (its "## " sections are kept).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
from openblas_env import openblas_note, rerun_without_openblas_env  # noqa: E402 - bench/, beside this script

ROOT = Path(__file__).resolve().parent.parent


def models():
    from infc.compiler.ocr import paddleocr_model_paths

    fixtures = ROOT / "tests" / "models"
    for name in ("cnn_ts", "cnn_dynamo", "bert_ts", "bert_dynamo", "gpt2_ts", "gpt2_dynamo", "llama_ts", "llama_dynamo"):
        yield name, fixtures / f"{name}.onnx", ROOT / "profiles" / f"{name.split('_')[0]}.yaml"
    for kind, path in paddleocr_model_paths().items():
        yield f"ppocr_{kind}", path, ROOT / "profiles" / f"ppocr_{kind}.yaml"


def median_ms(fn, iterations: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def bench_one(name, model_path, profile_path, cache_dir, iterations):
    import onnxruntime as ort

    from infc.compiler.build import BuildOptions, build
    from infc.compiler.runtime.feeds_io import random_plan_feeds
    from infc.compiler.runtime.session import PlanSession

    plan_path = Path(cache_dir) / f"{name}.plan"
    report = build(str(model_path), str(profile_path), str(plan_path),
                   BuildOptions(cache_dir=Path(cache_dir), show_progress=False))
    session = PlanSession(plan_path)
    feeds = session.check_feeds(random_plan_feeds(session, seed=0), "bench inputs")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    ort_session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in ort_session.get_outputs()]
    expected = ort_session.run(names, feeds)
    got = session.run(feeds)
    max_rel = max(float(np.abs(got[n].astype(np.float64) - e).max() / (np.abs(e).max() or 1.0))
                  for n, e in zip(names, expected) if e.dtype.kind == "f")
    # interleave the two so machine noise hits both alike
    infc_ms, ort_ms = [], []
    for _ in range(3):
        infc_ms.append(median_ms(lambda: session.run(feeds), iterations))
        ort_ms.append(median_ms(lambda: ort_session.run(names, feeds), iterations))
    infc_p50, ort_p50 = float(np.median(infc_ms)), float(np.median(ort_ms))
    shapes = {k: list(v.shape) for k, v in feeds.items()}
    return {"model": name, "inputs": shapes, "infc_p50_ms": round(infc_p50, 4), "ort_p50_ms": round(ort_p50, 4),
            "ratio": round(infc_p50 / ort_p50, 3), "max_rel_diff": max_rel, "fallback_ops": report.get("fallback_ops", []),
            "build_s": report["build_s"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--models", nargs="*", default=[])
    parser.add_argument("--keep-openblas-env", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--tag", default="", help="added to the results file's name (a machine's name: runs on two machines the same day keep both)")
    args = parser.parse_args()
    rerun_without_openblas_env(args.keep_openblas_env)
    openblas = openblas_note()
    rows = []
    with tempfile.TemporaryDirectory() as cache_dir:
        for name, path, profile in models():
            if args.models and not any(s in name for s in args.models):
                continue
            try:
                row = bench_one(name, path, profile, cache_dir, args.iterations)
            except Exception as exc:  # noqa: BLE001 - one broken model must not hide the others
                row = {"model": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    ok = [r for r in rows if "ratio" in r]
    geomean = math.exp(sum(math.log(r["ratio"]) for r in ok) / len(ok)) if ok else None
    import onnxruntime

    lines = ["| model | inputs | infc p50 ms | ORT p50 ms | infc/ORT | max rel diff | ORT islands |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "ratio" in r:
            lines.append(f"| {r['model']} | {r['inputs']} | {r['infc_p50_ms']:.3f} | {r['ort_p50_ms']:.3f} | {r['ratio']:.2f} | "
                         f"{r['max_rel_diff']:.1e} | {', '.join(r['fallback_ops']) or '-'} |")
        else:
            lines.append(f"| {r['model']} | | | | error | {r['error']} | |")
    summary = f"geometric mean infc/ORT: {geomean:.2f}" if geomean else "no model ran"
    print("\n".join(lines) + "\n" + summary)
    if args.no_write:
        return
    date = datetime.date.today().isoformat()
    meta = {"date": date, "machine": f"{platform.machine()}, {os.cpu_count()} cores{_cpu_model()}", "onnxruntime": onnxruntime.__version__,
            "numpy": np.__version__, "openblas_env": openblas, "iterations": args.iterations}
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    tag = f"-{args.tag}" if args.tag else ""
    (ROOT / "bench" / "results" / f"cpu_vs_ort{tag}-{date}.json").write_text(json.dumps({"meta": meta, "rows": rows, "geomean": geomean}, indent=2))
    doc = [f"# infc vs onnxruntime on the CPU ({date})", "",
           f"Command: `python bench/cpu_vs_ort.py` on {meta['machine']}; onnxruntime {meta['onnxruntime']} "
           f"(ORT_ENABLE_ALL, default threads), numpy {meta['numpy']}; OPENBLAS_CORETYPE/L2_SIZE {openblas}. "
           "Inputs: seeded random at each profile's opt shape (profiles/). Median of 3 interleaved medians of "
           f"{args.iterations} runs each.", "", *lines, "", summary, ""]
    path = ROOT / "docs" / "cpu-vs-ort.md"
    earlier = path.read_text() if path.exists() else ""
    kept = earlier[earlier.index("\n## ") + 1:] if "\n## " in earlier else ""  # the hand-written sections stay
    path.write_text("\n".join(doc) + ("\n" + kept if kept else ""))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f" ({line.split(':', 1)[1].strip()})"
    except OSError:
        pass
    return ""


if __name__ == "__main__":
    main()
