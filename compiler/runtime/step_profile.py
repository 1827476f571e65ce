"""Where a plan's run spends its time, step by step and per op type (`infc run --op-profile`), as
trtexec's --dumpProfile does for engine layers: a one-shot plan over runs of its own, a decoder plan's
model steps over the whole serving run.

Each step's kernel is timed with perf_counter while the profile is on; the executor is otherwise the
one that serves the plan. On a GPU plan each timed step waits for the device before its clock stops
(launches are asynchronous), so the profile's runs are slower than the latency runs, not overlapped. Steps whose results were memoized (shape arithmetic, run once per set of
input shapes) cost nothing and do not appear. What the steps' sum leaves of a run's latency is the
executor's own work: gathering arguments, freeing values, its loop.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass, field

from ..errors import BadInput

TOP_STEPS = 15  # steps in the printed table (the JSON has them all)
TOP_OPS = 10


@dataclass
class StepTimes:
    runs: int = 0
    seconds: dict = field(default_factory=lambda: defaultdict(float))  # step index -> total seconds
    calls: dict = field(default_factory=lambda: defaultdict(int))


@contextlib.contextmanager
def timing_steps(executor):
    """Within the block every step of `executor` (a CPU plan's or the GPU executor's) records its time
    into the yielded StepTimes; the steps run untimed again afterwards."""
    steps = getattr(executor, "_steps", None)
    if steps is None:
        raise BadInput("--op-profile times the steps of infc's executors; this plan runs on another")
    times = StepTimes()
    originals = [step.run for step in steps]
    backend = getattr(executor, "backend", None)
    wait = backend.synchronize if backend is not None else (lambda: None)

    def timed(index: int, run):
        def kernel(args, attrs, ctx):
            started = time.perf_counter()
            try:
                return run(args, attrs, ctx)
            finally:
                wait()
                times.seconds[index] += time.perf_counter() - started
                times.calls[index] += 1
        return kernel

    for index, step in enumerate(steps):
        step.run = timed(index, step.run)
    try:
        yield times
    finally:
        for step, run in zip(steps, originals):
            step.run = run


def profile_report(executor, times: StepTimes, latencies_ms: list[float]) -> dict:
    """{"steps": every timed step, slowest first, "ops": per op type, "executor_ms": the rest of a
    run} in milliseconds per run."""
    runs = max(times.runs, 1)
    steps = executor._steps
    rows = []
    for index, seconds in times.seconds.items():
        step = steps[index]
        rows.append({"step": step.label, "op": _op_type(step), "index": index,
                     "ms": seconds * 1e3 / runs, "calls": times.calls[index] / runs})
    rows.sort(key=lambda row: -row["ms"])
    total = sum(row["ms"] for row in rows)
    ops: dict[str, dict] = {}
    for row in rows:
        entry = ops.setdefault(row["op"], {"op": row["op"], "ms": 0.0, "steps": 0})
        entry["ms"] += row["ms"]
        entry["steps"] += 1
    for row in [*rows, *ops.values()]:
        row["share_pct"] = 100.0 * row["ms"] / total if total else 0.0
    # the executor's share: the latency runs' mean less the steps (None without latency runs: a decoder's
    # model steps are timed inside the serving loop)
    executor_ms = max(sum(latencies_ms) / len(latencies_ms) - total, 0.0) if latencies_ms else None
    return {"runs": times.runs, "steps_ms": total, "executor_ms": executor_ms,
            "steps": rows, "ops": sorted(ops.values(), key=lambda entry: -entry["ms"])}


def _op_type(step) -> str:
    """'domain.Op' of a CPU step (its key); a GPU step's label starts with it."""
    key = getattr(step, "key", None)
    if key is None:
        return step.label.split(" ", 1)[0]
    domain, op = key
    return f"{domain}.{op}" if domain else op


def format_profile(report: dict) -> list[str]:
    """The report as text lines: the slowest steps, then the op types."""
    if report["executor_ms"] is None:
        lines = [f"time per model step over {report['runs']} steps (prefill chunks and decodes): steps "
                 f"{report['steps_ms']:.3f} ms"]
    else:
        lines = [f"time per run over {report['runs']} more runs, each step timed: steps {report['steps_ms']:.3f} ms "
                 f"(mean), executor {report['executor_ms']:.3f} ms (the latency runs' mean less the steps)"]
    lines.append(f"{'ms':>9} {'share':>6}  step")
    for row in report["steps"][:TOP_STEPS]:
        lines.append(f"{row['ms']:9.3f} {row['share_pct']:5.1f}%  {row['step']}")
    if len(report["steps"]) > TOP_STEPS:
        lines.append(f"{'':>17}... {len(report['steps']) - TOP_STEPS} more steps (--json lists them all)")
    lines.append(f"{'ms':>9} {'share':>6}  op type (steps)")
    for entry in report["ops"][:TOP_OPS]:
        lines.append(f"{entry['ms']:9.3f} {entry['share_pct']:5.1f}%  {entry['op']} ({entry['steps']})")
    return lines
