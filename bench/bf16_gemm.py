"""The bf16 GEMM kernels alone against float32 sgemm, at encoder shapes, side by side in one process.

    python bench/bf16_gemm.py [--repeats 3] [--runs 9] [--tag TAG] [--no-write]

For each (M, K, N) (M = 128..512 tokens, K and N = 256..3072): OpenBLAS sgemm on one thread and as
infc's GEMMs run it (gemm_impls.product_into: one BLAS thread, large ones split with the helper
thread), and the bf16 kernels (runtime/amx_gemm.py on AMX-BF16, runtime/bf16_gemm.py on
AVX512-BF16) on one thread and split, each on bf16 values held in float32 (what a bf16 plan's GEMM
reads; the kernels' own activation rounding included in their time). Interleaved: `repeats`
rounds of every candidate, each the median of `runs` calls; the table shows each candidate's range
over the rounds in GFLOP/s and the median ratio to one-thread sgemm. Each kernel's output is
checked against a float64 product of the same values first. A kernel the CPU lacks is left out
(and said so). OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are unset for this benchmark (it re-runs
itself once, and says so). Results: bench/results/bf16_gemm[-TAG]-<date>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
from openblas_env import rerun_without_openblas_env  # noqa: E402 - bench/, beside this script

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(128, 256, 256), (128, 256, 1024), (128, 768, 768), (128, 768, 3072), (128, 3072, 768),
          (197, 384, 1536), (256, 1024, 1024), (512, 768, 768), (512, 768, 3072), (512, 3072, 768)]


def candidates():
    from infc.compiler.runtime import amx_gemm, bf16_gemm, gemm_impls

    def sgemm_one(a, w, packed, out):
        with gemm_impls.blas_threads(1):
            np.matmul(a, w, out=out)

    found = {"sgemm 1 thread": sgemm_one,
             "sgemm (infc split)": lambda a, w, packed, out: gemm_impls.product_into(a, w, out)}
    missing = []
    for name, product, available in (("amx", amx_gemm.amx_product, amx_gemm.has_amx_bf16),
                                     ("avx512-bf16", bf16_gemm.bf16_product, bf16_gemm.has_avx512_bf16)):
        if not available():
            missing.append(name)
            continue
        found[f"{name} 1 thread"] = lambda a, w, packed, out, p=product: p(a, packed, w.shape[1], out, split=False)
        found[f"{name} split"] = lambda a, w, packed, out, p=product: p(a, packed, w.shape[1], out, split=True)
    return found, missing


def median_s(run, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--keep-openblas-env", action="store_true")
    parser.add_argument("--tag", default="")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rerun_without_openblas_env(args.keep_openblas_env)
    from infc.compiler.runtime import bf16_gemm

    runners, missing = candidates()
    if missing:
        print(f"note: this CPU has no usable {', '.join(missing)}: left out")
    rng = np.random.default_rng(0)
    rows = []
    for m, k, n in SHAPES:
        a = bf16_gemm.bf16_values(rng.standard_normal((m, k)).astype(np.float32))
        w = bf16_gemm.bf16_values((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32))
        packed = bf16_gemm.pack_pairs(w)
        reference = a.astype(np.float64) @ w.astype(np.float64)
        out = np.empty((m, n), np.float32)
        errors = {}
        for label, run in runners.items():
            out[...] = np.nan
            run(a, w, packed, out)
            errors[label] = float(np.abs(out - reference).max() / np.abs(reference).max())
        gflop = 2 * m * k * n / 1e9
        rates = {label: [] for label in runners}
        for _ in range(args.repeats):
            for label, run in runners.items():  # interleaved: the machine's noise hits every candidate alike
                rates[label].append(gflop / median_s(lambda: run(a, w, packed, out), args.runs))
        base = statistics.median(rates["sgemm 1 thread"])
        row = {"M": m, "K": k, "N": n, "gflops": {label: [round(min(r)), round(max(r))] for label, r in rates.items()},
               "vs_sgemm_1_thread": {label: round(statistics.median(r) / base, 2) for label, r in rates.items()},
               "max_rel_error_vs_float64": {label: float(f"{e:.2g}") for label, e in errors.items()}}
        rows.append(row)
        print(f"M={m:4d} K={k:5d} N={n:5d}  " + "  ".join(
            f"{label} {lo}-{hi} GF/s (x{row['vs_sgemm_1_thread'][label]})" for label, (lo, hi) in row["gflops"].items()),
            flush=True)
    if args.no_write:
        return
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    date = datetime.date.today().isoformat()
    meta = {"date": date, "machine": f"{platform.machine()}, {os.cpu_count()} cores", "openblas_env": "unset for this run",
            "repeats": args.repeats, "runs": args.runs, "missing_kernels": missing, "load_1min_at_end": load}
    tag = f"-{args.tag}" if args.tag else ""
    path = ROOT / "bench" / "results" / f"bf16_gemm{tag}-{date}.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
