"""The CPU GEMM candidates side by side, as the autotuner measures them: median time and % of the vendor
(NumPy's matmul -> OpenBLAS) for M in {1, 8, 64, 512} x (N, K) in {(768, 768), (3072, 768), (768, 3072)}, float32.

    python bench/cpu_gemm_candidates.py                       # the full table, then the winners
    python bench/cpu_gemm_candidates.py --m 1 8 --rounds 5    # fewer shapes, more interleaved rounds
    python bench/cpu_gemm_candidates.py --json out.json       # also write every result as JSON

Every candidate is checked against the float64 product before it is timed. Timings move with the load
of the machine (another process on one of two cores hurts multi-threaded BLAS most), so rerun a shape
before trusting a small difference; rounds interleave the candidates to share that noise fairly.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))  # run from a checkout without installing

from infc.compiler.autotune import cpu_gemm  # noqa: E402
from infc.compiler.autotune.tuner import WallClockBench, results_table, tune_all  # noqa: E402

M_VALUES = (1, 8, 64, 512)
NK_VALUES = ((768, 768), (3072, 768), (768, 3072))


def _blas_info() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    return "; ".join(f"{i['internal_api']} {i['version']} {i.get('architecture', '')} threads={i['num_threads']}"
                     for i in threadpool_info() if i["user_api"] == "blas")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, nargs="+", default=M_VALUES)
    parser.add_argument("--candidate-budget", type=float, default=0.3, help="seconds per candidate, over all rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()

    console = Console(width=180)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    target = f"cpu-{platform.machine()}-{cores}c"
    blas_env = {k: v for k, v in os.environ.items() if k.startswith(("OPENBLAS", "OMP_", "MKL_"))}
    console.print(f"numpy BLAS: {_blas_info()}; {cores} cores; env {blas_env or '{}'}")
    keys = [cpu_gemm.gemm_key(m, n, k, "float32", target) for m in args.m for n, k in NK_VALUES]
    bench = WallClockBench(budget_s=args.candidate_budget / args.rounds)
    report = tune_all([cpu_gemm.gemm_problem(key) for key in keys], bench, rounds=args.rounds)
    console.print(results_table(report.results.values(), title=f"CPU GEMM candidates, float32 ({target})"))

    summary = Table(title="winners")
    for column in ("M", "N", "K", "vendor", "winner", "winner % of vendor", "runner-up (% of vendor)", "confirmation"):
        summary.add_column(column)
    for result in report.results.values():
        ranked = sorted((c for c in result.candidates if c.is_ok), key=lambda c: c.median_s)
        runner_up = next((c for c in ranked if c.config != result.winner), None)
        summary.add_row(*(str(result.key.dim(d)) for d in "MNK"), f"{result.vendor_s * 1e6:.1f} µs", str(result.winner),
                        f"{result.percent_of_vendor(result.result_of(result.winner)):.0f}%",
                        f"{runner_up.config} ({result.percent_of_vendor(runner_up):.0f}%)" if runner_up else "",
                        result.note.removeprefix("head-to-head: "))
    console.print(summary)
    if args.json:
        args.json.write_text(json.dumps(report.to_json(), indent=2, allow_nan=False) + "\n")


if __name__ == "__main__":
    main()
