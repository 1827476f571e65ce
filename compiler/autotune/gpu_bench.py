"""The GPU benchmark for the tuner: CUDA events around batches of launches, after a warm-up.

`bench(run)` takes a GemmRun (gpu_gemm.py) and returns `samples` per-call times, each the elapsed
time of one batch of calls divided by its size. Calls in a batch rotate over the run's input sets
(together over three times the L2), so small kernels are timed reading from memory, not from
cache; the batch holds enough calls to last `batch_s`, so launch gaps and event resolution stay
small against it. The tuner takes the median over its rounds.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CudaEventBench:
    cupy: Any = None          # the module (injected in tests); imported on first use otherwise
    warmup: int = 3
    samples: int = 9
    batch_s: float = 1e-3
    max_batch: int = 256

    def _cp(self):
        if self.cupy is not None:
            return self.cupy
        import cupy  # noqa: PLC0415 - GPU builds only

        return cupy

    def __call__(self, run) -> list[float]:
        cp = self._cp()
        for i in range(self.warmup):
            run.launch(i)
        cp.cuda.runtime.deviceSynchronize()
        begin = time.perf_counter()
        for i in range(run.num_sets):
            run.launch(i)
        cp.cuda.runtime.deviceSynchronize()
        estimate = max((time.perf_counter() - begin) / run.num_sets, 1e-7)  # host time included: an upper bound
        calls = run.num_sets * max(1, math.ceil(min(self.batch_s / estimate, self.max_batch) / run.num_sets))
        start, end = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for _ in range(self.samples):
            start.record()
            for i in range(calls):
                run.launch(i)
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) * 1e-3 / calls)
        return times
