"""One seed through `infc optimize` and `infc build`, judged against onnxruntime and the float64
reference; and the reduced-precision check."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx

from .builder import _feeds, random_case
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


def check_seed(seed: int, folder: Path) -> dict:
    import yaml

    from infc.compiler.build import BuildOptions, build
    from infc.compiler.errors import InfcError
    from infc.compiler.optimize import optimize_model
    from infc.compiler.runtime.session import PlanSession
    from infc.compiler.verify import ort_session

    model, levels = random_case(seed)
    names = [o.name for o in model.graph.output]
    reference = ort_session(model)  # onnxruntime's own fusions off: they have bugs of their own
    expected = {}
    for level, shape in levels.items():
        try:
            expected[level] = reference.run(names, _feeds(shape, seed))
        except Exception:  # noqa: BLE001 - a pooled size the min level makes empty: not a finding
            return {"seed": seed, "skipped": f"onnxruntime cannot run the model at the {level} shapes"}
    exact, in_float32 = run_double(model, {level: _feeds(shape, seed) for level, shape in levels.items()})
    # with ops of the reference in float32, only a gross error is a finding
    floor = ROUGH_RTOL if in_float32 else RTOL
    ops = [n.op_type for n in model.graph.node]
    result = {"seed": seed, "nodes": len(ops), "ops": ops, "findings": []}

    def judge(check: str, level: str, actual: list) -> None:
        result[check] = error = _worst(expected[level], actual)
        if error <= RTOL:
            return
        if exact is not None:  # as far from float64 as onnxruntime's own float32 run, give or take: no finding
            ours, theirs = _worst(exact[level], actual), _worst(exact[level], expected[level])
            result[f"{check}_vs_float64"] = [ours, theirs]
            if ours <= max(floor, 10 * theirs):
                return
        result["findings"].append(check)

    optimized = optimize_model(model).model
    try:  # as users run it: with onnxruntime's own fusions on top of infc's
        session = ort_session(optimized, optimize=True)
    except Exception:  # noqa: BLE001 - onnxruntime's optimizer failing on the original too is not ours
        try:
            ort_session(model, optimize=True)
        except Exception:  # noqa: BLE001
            return {"seed": seed, "skipped": "onnxruntime's optimizer fails on the original model"}
        raise
    for level, shape in levels.items():
        judge(f"optimize_{level}", level, session.run(names, _feeds(shape, seed)))
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
    for level, shape in levels.items():
        outputs = plan_session.run(plan_session.check_feeds(_feeds(shape, seed), "fuzz"))
        judge(f"plan_{level}", level, [outputs[n] for n in names])
    return result


PRECISION_SLACK = 3  # fresh inputs may sit a little past the repair's own samples


def check_precision(seed: int, folder: Path, precision: str) -> dict:
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

    model, levels = random_case(seed)
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
