"""One seed through `infc optimize` and `infc build`, judged against onnxruntime and the float64
reference; and the reduced-precision check."""

from __future__ import annotations

import os
import tempfile
import traceback
from pathlib import Path

import numpy as np
import onnx

from .builder import _feeds, flags_of, random_case
from .reference import run_double

os.environ.setdefault("INFC_WHOLE_MODEL", "0")  # infc's own kernels, not onnxruntime on the whole model

RTOL = 1e-4
ROUGH_RTOL = 1e-3


def _worst(expected: list, actual: list) -> float:
    worst = 0.0
    for want, got in zip(expected, actual):
        want, got = np.asarray(want, np.float64), np.asarray(got, np.float64)
        if want.shape != got.shape:
            return float("inf")
        scale = max(np.abs(want).max(initial=0.0), 1e-6)
        worst = max(worst, float(np.abs(want - got).max(initial=0.0) / scale))
    return worst


# (first threshold, float64 floor) by the seed's flags: a value rounded to float16 carries a whole
# float16 step (5e-4 relative) for any 1-ulp difference before it
TOLERANCES = {"fp16_model": (2e-3, 1e-2), "fp16": (2e-3, 1e-2)}
# a Q/DQ rounding, or a comparison of float16 values, flips on a 1-ulp difference before it (a whole
# quantization step after, or the other branch of a Where): such a
# seed is judged on three feeds and a finding is one that all three show
NUM_FEEDS = {"quantized": 3, "fp16_model": 3, "fp16": 3, "exact_ints": 3}


def check_seed(seed: int, folder: Path, forms: str = "all") -> dict:
    import yaml

    from infc.compiler.build import BuildOptions, build
    from infc.compiler.errors import InfcError
    from infc.compiler.optimize import optimize_model
    from infc.compiler.runtime.session import PlanSession
    from infc.compiler.verify import ort_session

    model, levels = random_case(seed, forms)
    flags = flags_of(model)
    names = [o.name for o in model.graph.output]
    x_dtype = onnx.helper.tensor_dtype_to_np_dtype(model.graph.input[0].type.tensor_type.elem_type)
    num_feeds = max([NUM_FEEDS.get(f, 1) for f in flags], default=1)
    feeds = {level: [_feeds(shape, seed + 7919 * k, x_dtype) for k in range(num_feeds)] for level, shape in levels.items()}
    rtol, floor = max([TOLERANCES.get(f, (RTOL, RTOL)) for f in flags], default=(RTOL, RTOL))
    try:
        reference = ort_session(model)  # onnxruntime's own fusions off: they have bugs of their own
    except Exception as exc:  # noqa: BLE001 - no kernel for an op in this type (float16 Conv on the CPU)
        return {"seed": seed, "skipped": f"onnxruntime cannot load the model: {str(exc).splitlines()[0][:160]}"}
    expected = {}
    for level in levels:
        try:
            expected[level] = [reference.run(names, f) for f in feeds[level]]
        except Exception:  # noqa: BLE001 - a pooled size the min level makes empty: not a finding
            return {"seed": seed, "skipped": f"onnxruntime cannot run the model at the {level} shapes"}
    exact = [run_double(model, {level: feeds[level][k] for level in levels}) for k in range(num_feeds)]
    # with ops of the reference in float32, only a gross error is a finding
    floor = max(floor, ROUGH_RTOL if exact[0][1] else RTOL)
    ops = [n.op_type for n in model.graph.node]
    result = {"seed": seed, "nodes": len(ops), "ops": ops, "findings": [], "flags": sorted(flags),
              "opset": next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))}

    def is_off(check: str, level: str, k: int, actual: list, wanted: list) -> bool:
        dtypes = [(np.asarray(w).dtype.name, np.asarray(a).dtype.name) for w, a in zip(wanted, actual)]
        if any(w != a for w, a in dtypes):  # an int32 output come back as int64 is wrong whatever its values
            result[f"{check}_dtypes"] = [pair for pair in dtypes if pair[0] != pair[1]]
            result[check] = float("inf")
            return True
        error = _worst(wanted, actual)
        result[check] = min(result.get(check, error), error)
        if error <= rtol:
            return False
        if exact[k][0] is not None:  # as far from float64 as onnxruntime's own run, give or take: no finding
            ours, theirs = _worst(exact[k][0][level], actual), _worst(exact[k][0][level], wanted)
            result[f"{check}_vs_float64"] = [ours, theirs]
            if ours <= max(floor, 10 * theirs):
                return False
        return True

    def is_finding(check: str, level: str, run, *others) -> bool:
        """Off on every feed, from onnxruntime on the original and from each of `others` (the original
        through onnxruntime's own optimizer, whose QDQ fusions round differently)."""
        for k, f in enumerate(feeds[level]):
            actual = run(f)
            if not is_off(check, level, k, actual, expected[level][k]) or \
                    any(not is_off(check, level, k, actual, other(f)) for other in others):
                return False
        return True

    def judge(check: str, level: str, run, *others) -> None:
        if is_finding(check, level, run, *others):
            result["findings"].append(check)

    optimized = optimize_model(model).model
    try:
        original_optimized = ort_session(model, optimize=True)
        for level in levels:  # onnx's Slice-10 inference types x[..., 0:0] of a symbolic dim as whole, and
            # onnxruntime's planner then reuses a buffer of that size (fuzz_graphs --forms old seed 840)
            original_optimized.run(names, feeds[level][0])
    except Exception:  # noqa: BLE001 - onnxruntime's optimizer failing on the original is not ours
        return {"seed": seed, "skipped": "onnxruntime's optimizer fails on the original model"}
    session = ort_session(optimized, optimize=True)  # as users run it: onnxruntime's fusions on top of infc's
    plain_session = ort_session(optimized)
    for level in levels:
        check = f"optimize_{level}"
        if is_finding(check, level, lambda f: session.run(names, f), lambda f: original_optimized.run(names, f)):
            # infc's model right in onnxruntime without its optimizer: the difference is what those
            # fusions make of infc's graph (QLinear kernels rounding once where QDQ rounds twice)
            if is_finding(check, level, lambda f: plain_session.run(names, f)):
                result["findings"].append(check)
            else:
                result.setdefault("onnxruntime_fusions_differ", []).append(check)
    path, profile, plan = folder / "model.onnx", folder / "profile.yaml", folder / "plan.bin"
    onnx.save(model, path)
    profile.write_text(yaml.safe_dump({"inputs": {name: {level: shapes[name] for level, shapes in levels.items()}
                                                  for name in levels["opt"]}}))
    options = BuildOptions(cache_dir=folder / "cache", use_cache=False, show_progress=False, allow_fallback=False)
    try:
        build(str(path), str(profile), str(plan), options)
        result["fallback"] = False
    except InfcError:  # an op without a native kernel: islands allowed
        options.allow_fallback = True
        build(str(path), str(profile), str(plan), options)
        result["fallback"] = True
    plan_session = PlanSession(plan)
    for level in levels:
        # a plan's steps may run in an onnxruntime session (its tactics), optimizations on
        judge(f"plan_{level}", level, lambda f: [plan_session.run(plan_session.check_feeds(f, "fuzz"))[n] for n in names],
              lambda f: original_optimized.run(names, f))
    return result


PRECISION_SLACK = 3  # fresh inputs may sit a little past the repair's own samples


def check_precision(seed: int, folder: Path, precision: str, forms: str = "all") -> dict:
    """A reduced-precision plan either keeps its error within the tolerance on fresh inputs at the
    opt shapes (the 99.9th percentile of element errors, as the repair budgets it, with slack) or
    said it does not (plan metadata `accuracy.within_tolerance`, a build warning): never silently off."""
    import yaml

    from infc.compiler.build import BuildOptions, build
    from infc.compiler.build_precision import DEFAULT_TOLERANCE
    from infc.compiler.plan.format import read_plan
    from infc.compiler.quantize.accuracy import compare_runs, worst
    from infc.compiler.runtime.session import PlanSession
    from infc.compiler.verify import ort_session

    model, levels = random_case(seed, forms)
    if "fp16_model" in flags_of(model):
        return {"seed": seed, "skipped": "the model is in float16 already"}
    names = [o.name for o in model.graph.output]
    feeds = [_feeds(levels["opt"], 1000 + k) for k in range(4)]
    try:
        expected = [ort_session(model).run(names, f) for f in feeds]
    except Exception:  # noqa: BLE001
        return {"seed": seed, "skipped": "onnxruntime cannot run the model at the opt shapes"}
    path, profile, plan = folder / "model.onnx", folder / "profile.yaml", folder / "plan.bin"
    onnx.save(model, path)
    profile.write_text(yaml.safe_dump({"inputs": {name: {level: shapes[name] for level, shapes in levels.items()}
                                                  for name in levels["opt"]}}))
    for level, shapes in levels.items():
        try:
            ort_session(model).run(names, _feeds(shapes, seed))
        except Exception:  # noqa: BLE001
            return {"seed": seed, "skipped": f"onnxruntime cannot run the model at the {level} shapes"}
    build(str(path), str(profile), str(plan), BuildOptions(cache_dir=folder / "cache", use_cache=False,
                                                           show_progress=False, precision=precision))
    accuracy = (read_plan(plan).meta.get("precision") or {}).get("accuracy", {})
    session = PlanSession(plan)
    actual = [[session.run(session.check_feeds(f, "fuzz"))[n] for n in names] for f in feeds]
    error = worst(compare_runs(model, names, expected, actual), "q_rel")
    result = {"seed": seed, "nodes": len(model.graph.node), "ops": [n.op_type for n in model.graph.node],
              "q_rel": error, "within_tolerance": accuracy.get("within_tolerance"), "findings": [], "fallback": True}
    if error > PRECISION_SLACK * DEFAULT_TOLERANCE and accuracy.get("within_tolerance") is not False:
        result["findings"].append("q_rel")
    return result


def run_one(seed: int, forms: str = "all", precision: str | None = None) -> dict:
    """One seed's result; an exception in it is a finding (error, with the trace's last frames)."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            return (check_precision(seed, Path(tmp), precision, forms) if precision
                    else check_seed(seed, Path(tmp), forms))
        except Exception as exc:  # noqa: BLE001 - reported with its seed
            return {"seed": seed, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
                    "trace": traceback.format_exc(limit=-3)}
