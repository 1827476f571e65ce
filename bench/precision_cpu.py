"""Are --precision int8 / fp16 / bf16 CPU plans worth building? Side by side in one process: infc's
fp32, int8, fp16 and bf16 plans, onnxruntime on the fp32 model, on the QDQ model `infc optimize
--precision int8` writes and on onnxruntime's own `quantize_static` QDQ model (per-channel, U8S8,
MinMax, the same calibration samples); interleaved rounds, medians; latency over the fp32 plan's,
accuracy against onnxruntime's fp32 outputs on held-out inputs (max relative error of the worst
output, top-1 agreement where the first output is a [batch, classes] matrix).

    python bench/precision_cpu.py --work DIR NAME=MODEL.onnx,PROFILE.yaml,CALIB.npz[,EVAL.npz] ...
        [--precisions fp32,int8,fp16,bf16] [--rounds 7] [--iterations 5] [--rebuild] [--tag TAG] [--no-write]

Plans are built through the CLI (`infc build ... --no-cache`), as a user would, into DIR (kept and
reused unless --rebuild). CALIB.npz stacks the calibration samples on a leading axis (as --calib
takes them); EVAL.npz the held-out ones (default: 8 seeded normal samples at the profile's opt shape).
OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are unset for this benchmark (it re-runs itself once, and says so).
Results: bench/results/precision_cpu[-TAG]-<date>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from openblas_env import rerun_without_openblas_env  # noqa: E402 - bench/, beside this script

ROOT = Path(__file__).resolve().parent.parent
NUM_EVAL = 8


def infc(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "infc.cli", *args], check=True, stdout=subprocess.DEVNULL)


def ort_session(path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_quantize_static(model: Path, calib: dict, out: Path) -> None:
    """onnxruntime's own QDQ model: what a user of onnxruntime's quantizer gets on this CPU."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self):
            count = len(next(iter(calib.values())))
            self.samples = iter([{k: v[i] for k, v in calib.items()} for i in range(count)])

        def get_next(self):
            return next(self.samples, None)

    prepared = out.with_suffix(".pre.onnx")
    quant_pre_process(str(model), str(prepared), skip_symbolic_shape=True)
    quantize_static(str(prepared), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    prepared.unlink()


def prepare(name: str, model: Path, profile: Path, calib_path: Path, work: Path, precisions, rebuild: bool) -> dict:
    """The candidates' runners by label, building what is missing."""
    from infc.compiler.runtime.session import PlanSession

    calib = dict(np.load(calib_path))
    runners = {}
    for precision in precisions:
        plan = work / f"{name}_{precision}.plan"
        if rebuild or not plan.exists():
            extra = ["--calib", str(calib_path)] if precision == "int8" else []
            started = time.perf_counter()
            infc("build", str(model), "--profile", str(profile), "-o", str(plan), "--precision", precision, "--no-cache", *extra)
            print(f"  built {plan.name} in {time.perf_counter() - started:.0f} s", flush=True)
        session = PlanSession(plan)
        runners[f"infc {precision}"] = session.run
    reference = ort_session(model)
    names = [o.name for o in reference.get_outputs()]
    runners["ort fp32"] = lambda feeds, s=reference: dict(zip(names, s.run(names, feeds)))
    qdq = work / f"{name}_infc_qdq.onnx"
    if rebuild or not qdq.exists():
        infc("optimize", str(model), "-o", str(qdq), "--precision", "int8", "--calib", str(calib_path))
    ort_qdq = work / f"{name}_ort_qdq.onnx"
    if rebuild or not ort_qdq.exists():
        ort_quantize_static(model, calib, ort_qdq)
    for label, path in (("ort on infc QDQ", qdq), ("ort on ort QDQ", ort_qdq)):
        session = ort_session(path)
        runners[label] = lambda feeds, s=session: dict(zip(names, s.run(names, feeds)))
    return runners, reference, names


def eval_feeds(reference, profile: Path, eval_path: Path | None) -> list[dict]:
    import yaml

    if eval_path is not None:
        stacked = dict(np.load(eval_path))
        return [{k: v[i] for k, v in stacked.items()} for i in range(len(next(iter(stacked.values()))))]
    shapes = yaml.safe_load(profile.read_text())["inputs"]
    rng = np.random.default_rng(1234)
    opt = {k: (v["opt"] if isinstance(v, dict) else v) for k, v in shapes.items()}
    return [{k: rng.standard_normal(s).astype(np.float32) for k, s in opt.items()} for _ in range(NUM_EVAL)]


def accuracy(run, reference, names, feeds_list) -> dict:
    worst, agree, classified = 0.0, 0, 0
    for feeds in feeds_list:
        want = reference.run(names, feeds)
        got = run(feeds)
        for name, expected in zip(names, want):
            value = np.asarray(got[name], np.float64)
            worst = max(worst, float(np.abs(value - expected).max() / (np.abs(expected).max() or 1.0)))
        first = np.asarray(want[0])
        if first.ndim == 2:
            classified += first.shape[0]
            agree += int((np.argmax(np.asarray(got[names[0]]), -1) == np.argmax(first, -1)).sum())
    return {"max_rel": worst, "top1": agree / classified if classified else None}


def timings(runners: dict, feeds: dict, rounds: int, iterations: int) -> dict:
    for run in runners.values():  # warm-up: compiled kernels, sessions, prepacking
        run(feeds)
        run(feeds)
    samples = {label: [] for label in runners}
    for _ in range(rounds):  # interleaved: machine noise hits every candidate alike
        for label, run in runners.items():
            for _ in range(iterations):
                start = time.perf_counter()
                run(feeds)
                samples[label].append((time.perf_counter() - start) * 1e3)
    return {label: statistics.median(values) for label, values in samples.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="NAME=MODEL.onnx,PROFILE.yaml,CALIB.npz[,EVAL.npz]")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--precisions", default="fp32,int8,fp16,bf16")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--keep-openblas-env", action="store_true")
    parser.add_argument("--tag", default="")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rerun_without_openblas_env(args.keep_openblas_env)
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in args.models:
        name, paths = spec.split("=", 1)
        parts = [Path(p) for p in paths.split(",")]
        model, profile, calib = parts[:3]
        print(f"{name}:", flush=True)
        runners, reference, names = prepare(name, model, profile, calib, args.work, args.precisions.split(","), args.rebuild)
        feeds_list = eval_feeds(reference, profile, parts[3] if len(parts) > 3 else None)
        medians = timings(runners, feeds_list[0], args.rounds, args.iterations)
        base = medians["infc fp32"] if "infc fp32" in medians else medians["ort fp32"]
        for label, run in runners.items():
            row = {"model": name, "candidate": label, "p50_ms": round(medians[label], 3),
                   "vs_fp32_plan": round(medians[label] / base, 3),
                   "vs_ort_fp32": round(medians[label] / medians["ort fp32"], 3), **accuracy(run, reference, names, feeds_list)}
            rows.append(row)
            print(f"  {label:16s} {row['p50_ms']:9.2f} ms  x{row['vs_fp32_plan']:.2f} of the fp32 plan  "
                  f"x{row['vs_ort_fp32']:.2f} of ort fp32  max_rel {row['max_rel']:.2e}"
                  + (f"  top-1 {row['top1']:.0%}" if row["top1"] is not None else ""), flush=True)
    if args.no_write:
        return
    import onnxruntime

    date = datetime.date.today().isoformat()
    meta = {"date": date, "machine": f"{platform.machine()}, {os.cpu_count()} cores", "onnxruntime": onnxruntime.__version__,
            "openblas_env": "unset for this run", "rounds": args.rounds, "iterations": args.iterations,
            "models": args.models}
    tag = f"-{args.tag}" if args.tag else ""
    out = ROOT / "bench" / "results" / f"precision_cpu{tag}-{date}.json"
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
