"""infc plan vs onnxruntime on the CPU for models outside the repository (downloaded wheels, a
user's own): a folder of NAME.onnx, each with NAME.yaml (its shape profile) and, for models whose
control flow reads input values (a sample rate, a state), NAME.npz (real feeds, given to the build
as --inputs and timed on). Built with default options, then timed side by side in one run against
onnxruntime with its default session options (ORT_ENABLE_ALL, a thread per core) and at one
intra-op thread.

    python bench/models_vs_ort.py DIR [--models SUBSTR ...] [--iterations N] [--keep-openblas-env] [--json OUT]

bench/small_models/ holds the profiles of the small real models from PyPI wheels that docs/cpu-vs-ort.md
measures (silero-vad, openWakeWord, basic-pitch, speechmos' AECMOS, EfficientWord-Net's QDQ ResNet):
`pip download --no-deps` the wheels, link each package's .onnx there under the profile's name
(silero_op15 = silero_vad_16k_op15.onnx, oww_jarvis = hey_jarvis_v0.1.onnx, aecmos =
Run_1663829550_Stage_0.onnx, effword_qdq = the _qint8 model, ...) and run its make_feeds.py.

Prints one JSON row a model, then a table of p50 ms and infc/ORT. OPENBLAS_CORETYPE / L2_SIZE are
unset for the run (openblas_env.py) unless --keep-openblas-env. Nothing is written but --json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np
from cpu_vs_ort import median_ms  # noqa: E402 - bench/, beside this script
from openblas_env import openblas_note, rerun_without_openblas_env  # noqa: E402


def bench_one(model_path: Path, cache_dir: str, iterations: int) -> dict:
    import onnxruntime as ort

    from infc.compiler.build import BuildOptions, build
    from infc.compiler.runtime.feeds_io import load_feeds, random_plan_feeds
    from infc.compiler.runtime.session import PlanSession

    npz = model_path.with_suffix(".npz")
    given = load_feeds(str(npz)) if npz.exists() else None
    plan_path = Path(cache_dir) / f"{model_path.stem}.plan"
    report = build(str(model_path), str(model_path.with_suffix(".yaml")), str(plan_path),
                   BuildOptions(cache_dir=Path(cache_dir), show_progress=False, sample_feeds=given, sample_feeds_source=str(npz)))
    session = PlanSession(plan_path)
    feeds = session.check_feeds(given if given is not None else random_plan_feeds(session, seed=0), "bench inputs")
    sessions = {}
    for label, threads in (("ort", 0), ("ort_1t", 1)):
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = threads
        sessions[label] = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in sessions["ort"].get_outputs()]
    expected = sessions["ort"].run(names, feeds)
    got = session.run(feeds)
    max_rel = max((float(np.abs(got[n].astype(np.float64) - e).max() / (np.abs(e).max() or 1.0))
                   for n, e in zip(names, expected) if e.dtype.kind == "f" and e.size), default=0.0)
    runs = {"infc": lambda: session.run(feeds), **{label: (lambda s=s: s.run(names, feeds)) for label, s in sessions.items()}}
    samples = {label: [] for label in runs}
    for _ in range(3):  # interleaved rounds: the machine's noise hits all alike
        for label, run in runs.items():
            samples[label].append(median_ms(run, iterations))
    p50 = {label: float(np.median(times)) for label, times in samples.items()}
    steps = session.plan.meta["program"]
    return {"model": model_path.stem, "inputs": {k: list(np.shape(v)) for k, v in feeds.items()},
            **{f"{label}_p50_ms": round(ms, 4) for label, ms in p50.items()},
            "ratio": round(p50["infc"] / p50["ort"], 3), "ratio_1t": round(p50["infc"] / p50["ort_1t"], 3),
            "max_rel_diff": max_rel, "num_steps": len(steps),
            "islands": sorted({s.get("name", "") for s in steps if s.get("op") == "__island__"})[:4],
            "build_s": report["build_s"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--models", nargs="*", default=[])
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--keep-openblas-env", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rerun_without_openblas_env(args.keep_openblas_env)
    rows = []
    with tempfile.TemporaryDirectory() as cache_dir:
        for model_path in sorted(args.folder.glob("*.onnx")):
            if args.models and not any(s in model_path.stem for s in args.models):
                continue
            try:
                row = bench_one(model_path, cache_dir, args.iterations)
            except Exception as exc:  # noqa: BLE001 - one broken model must not hide the others
                row = {"model": model_path.stem, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
            row["load"] = os.getloadavg()[0]
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"OPENBLAS_CORETYPE/L2_SIZE {openblas_note()}")
    print("| model | infc ms | ORT ms | ORT 1-thread ms | infc/ORT | infc/ORT 1t | steps | max rel diff | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "ratio" in r:
            print(f"| {r['model']} | {r['infc_p50_ms']:.3f} | {r['ort_p50_ms']:.3f} | {r['ort_1t_p50_ms']:.3f} | {r['ratio']:.2f} | "
                  f"{r['ratio_1t']:.2f} | {r['num_steps']} | {r['max_rel_diff']:.1e} | {r['load']:.1f} |")
        else:
            print(f"| {r['model']} | error: {r['error']} | | | | | | | {r['load']:.1f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
