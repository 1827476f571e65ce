"""One core or two on AMX-BF16 tiles: when splitting a bf16 product with the helper thread pays.

    python bench/amx_split.py [--repeats 3] [--runs 15] [--tag TAG] [--no-write]

The same work on one core and split between two, side by side in one process (interleaved rounds,
each the median of `runs` calls): bf16 GEMMs at transformer sizes (runtime/amx_gemm.py,
`amx_product(split=...)`) and 3x3 convolutions by taps (runtime/kernels/amx_taps.py, its
SPLIT_MIN_MACS moved past the size), and, as the control, two threads each running their own
tile products or their own float32 sgemm (how the two cores scale on independent work). The
thresholds amx_gemm.SPLIT_MIN_MACS and amx_taps.SPLIT_MIN_MACS come from this table. Needs
AMX-BF16 (says so and stops without it). OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are unset for this
benchmark (it re-runs itself once, and says so). Results: bench/results/amx_split[-TAG]-<date>.json.
"""

from __future__ import annotations

import datetime
import json
import platform
import statistics
import threading
import time
from pathlib import Path

import numpy as np
from amx_conv import bench_args, median_ms  # noqa: E402 - bench/, beside this script
from openblas_env import openblas_note  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GEMMS = [(128, 768, 768), (197, 384, 1152), (128, 768, 3072), (128, 3072, 768), (512, 768, 768), (512, 768, 3072),
         (1024, 1024, 1024)]
# (batch, channels, size): 3x3 convolutions, pad 1, as many outputs as inputs
CONVS = [(1, 64, 56), (1, 128, 28), (1, 256, 14), (1, 512, 7), (1, 64, 112), (4, 64, 56), (1, 128, 128)]


def interleaved(candidates: dict, repeats: int, runs: int) -> dict:
    times = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, run in candidates.items():
            times[name].append(median_ms(run, runs))
    return {name: statistics.median(values) for name, values in times.items()}


def two_threads_scaling(work, repeats: int) -> float:
    """Time of work() on one thread x 2 over the time of two threads each running work()."""
    work()
    one = min(_timed(work) for _ in range(repeats))
    two = min(_timed(lambda: _both(work)) for _ in range(repeats))
    return 2 * one / two


def _timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _both(work):
    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main() -> int:
    args = bench_args(__doc__)

    from infc.compiler.runtime import amx_gemm, bf16_gemm
    from infc.compiler.runtime.kernels import amx_taps

    if not amx_gemm.has_amx_bf16():
        print("this CPU has no usable AMX-BF16: nothing to compare")
        return 0
    rng = np.random.default_rng(0)
    result = {"gemm": [], "conv": []}
    print(f"{'bf16 GEMM (M x K x N)':32} {'MACs':>7} {'1 core':>8} {'2 cores':>8} {'speedup':>8}")
    for m, k, n in GEMMS:
        a = rng.standard_normal((m, k)).astype(np.float32)
        panels = bf16_gemm.pack_pairs(rng.standard_normal((k, n)).astype(np.float32))
        med = interleaved({split: (lambda split=split: amx_gemm.amx_product(a, panels, n, split=split))
                           for split in (False, True)}, args.repeats, args.runs)
        row = {"shape": [m, k, n], "macs": m * k * n, "one_core_ms": round(med[False], 4), "two_cores_ms": round(med[True], 4)}
        result["gemm"].append(row)
        print(f"{f'{m} x {k} x {n}':32} {m * k * n / 1e6:6.0f}M {med[False]:8.3f} {med[True]:8.3f} {med[False] / med[True]:8.2f}")
    print(f"\n{'3x3 convolution by taps':32} {'MACs':>7} {'1 core':>8} {'2 cores':>8} {'speedup':>8}")
    threshold = amx_taps.SPLIT_MIN_MACS
    for batch, c, size in CONVS:
        x = bf16_gemm.bf16_values(rng.standard_normal((batch, c, size, size)).astype(np.float32))
        w = bf16_gemm.bf16_values(rng.standard_normal((c, c, 3, 3)).astype(np.float32))
        memo: dict = {}

        def conv(split: bool, x=x, w=w, memo=memo):
            amx_taps.SPLIT_MIN_MACS = 0 if split else 1 << 62
            try:
                return amx_taps.tap_conv(x, w, (1, 1), (1, 1), (1, 1), (1, 1), (size, size), memo)
            finally:
                amx_taps.SPLIT_MIN_MACS = threshold

        med = interleaved({split: (lambda split=split: conv(split)) for split in (False, True)}, args.repeats, args.runs)
        macs = batch * c * c * 9 * size * size
        row = {"batch": batch, "channels": c, "size": size, "macs": macs, "one_core_ms": round(med[False], 4),
               "two_cores_ms": round(med[True], 4)}
        result["conv"].append(row)
        print(f"{f'{batch} x {c} x {size} x {size}':32} {macs / 1e6:6.0f}M {med[False]:8.3f} {med[True]:8.3f} "
              f"{med[False] / med[True]:8.2f}")
    a = rng.standard_normal((128, 768)).astype(np.float32)
    panels = bf16_gemm.pack_pairs(rng.standard_normal((768, 768)).astype(np.float32))
    b = rng.standard_normal((256, 256)).astype(np.float32)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        result["independent_scaling"] = {
            "tiles": round(two_threads_scaling(lambda: [amx_gemm.amx_product(a, panels, 768, split=False)
                                                        for _ in range(400)], args.repeats), 3),
            "sgemm": round(two_threads_scaling(lambda: [b @ b for _ in range(2000)], args.repeats), 3)}
    print(f"\ntwo threads on independent work, over one: tiles {result['independent_scaling']['tiles']:.2f}x, "
          f"float32 sgemm {result['independent_scaling']['sgemm']:.2f}x")
    print(f"thresholds: amx_gemm.SPLIT_MIN_MACS {amx_gemm.SPLIT_MIN_MACS / 1e6:.0f}M, "
          f"amx_taps.SPLIT_MIN_MACS {threshold / 1e6:.0f}M")
    if not args.no_write:
        day = datetime.date.today().isoformat()
        path = ROOT / "bench" / "results" / f"amx_split{'-' + args.tag if args.tag else ''}-{day}.json"
        path.write_text(json.dumps({"date": day, "machine": platform.processor() or platform.machine(),
                                    "openblas_env": openblas_note(), "repeats": args.repeats, "runs": args.runs,
                                    **result}, indent=1) + "\n")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
