"""Does a reduced-precision CPU plan pay? Its program's time at the opt shapes (the build's
in-context race, tune_context.py) against onnxruntime running the fp32 model as given, timed in
the same build on the same inputs.

Why: `--precision bf16` makes a plan whose GEMMs and convolutions run on AMX tiles where that is
faster, but whether the whole plan beats plain fp32 depends on the model and the CPU: a bf16
ResNet-50 plan ran 1.55x onnxruntime fp32 on a Sapphire Rapids core (onnxruntime keeps its
blocked layout between convolutions), where a bf16 ViT ran 0.3x. A user who asked for bf16 to go
faster is told so at build time, and `inspect` repeats it, instead of finding out by benchmarking.
"""

from __future__ import annotations

import statistics
import time

import onnx

SLOWER_BY = 1.1  # the plan counts as slower than fp32 when this much over onnxruntime's time
BUDGET_S = 1.0  # timing onnxruntime stops after this much (and after at least MIN_RUNS runs)
MIN_RUNS, MAX_RUNS = 3, 20


def fp32_payoff(model: onnx.ModelProto, feeds: dict, tuning_meta: dict) -> dict | None:
    """{"plan_ms", "fp32_onnxruntime_ms", "ratio"} or None (no program time was measured, or
    onnxruntime does not run the model as given on these inputs)."""
    context = tuning_meta.get("conv_tactics") or {}
    plan_ms = (context.get("program_ms") or {}).get(context.get("kept"))
    if not plan_ms:
        return None
    from .verify import ort_session  # noqa: PLC0415

    names = [o.name for o in model.graph.output]
    try:
        session = ort_session(model, optimize=True)
        for _ in range(2):  # warm-up: first runs allocate
            session.run(names, feeds)
        times, started = [], time.perf_counter()
        while len(times) < MIN_RUNS or (len(times) < MAX_RUNS and time.perf_counter() - started < BUDGET_S):
            start = time.perf_counter()
            session.run(names, feeds)
            times.append(time.perf_counter() - start)
    except Exception:  # noqa: BLE001 - onnxruntime's errors have no common base: nothing to compare
        return None
    fp32_ms = 1e3 * statistics.median(times)
    return {"plan_ms": round(float(plan_ms), 3), "fp32_onnxruntime_ms": round(fp32_ms, 3),
            "ratio": round(float(plan_ms) / max(fp32_ms, 1e-9), 3)}


def payoff_note(payoff: dict | None, precision: str) -> str | None:
    """A line for the build's log and `inspect` when the plan is slower than onnxruntime fp32."""
    if not payoff or payoff["ratio"] <= SLOWER_BY:
        return None
    return (f"note: this {precision} plan's program took {payoff['plan_ms']:.3g} ms at the opt shapes, onnxruntime "
            f"{payoff['fp32_onnxruntime_ms']:.3g} ms on the fp32 model ({payoff['ratio']:.2f}x): {precision} does "
            "not pay on this CPU for this model; an fp32 plan would be faster")

