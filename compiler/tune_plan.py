"""GEMM tuning for a plan: every MatMul with a constant 2-D weight gets, per M bucket its profile
range covers, the fastest CPU candidate (the vendor library always competes), taken from the
timing cache when another build measured it already. The step becomes an `infc.cpu.TunedMatMul`
whose variants name the winner and its pre-packed weights; M beyond the last tuned bucket runs the
generic kernel. A GEMM whose activation and weight hold bf16 values (a bf16 plan's: bf16_sites.py)
is tuned under a bf16 key, where the bf16 kernels (AMX-BF16, AVX512-BF16) compete too. Convolutions
and tuned GEMM steps then get a tactic (tune_vendor.py): infc's kernel or onnxruntime's."""

from __future__ import annotations

import numpy as np

from .autotune.buckets import bucket_of
from .autotune.cpu_gemm import BF16, gemm_key, gemm_problem, prepack
from .bf16_sites import BF16 as BF16_CODE
from .bf16_sites import bf16_valued, rounded_by_readers
from .gemm_as_matmul import gemms_as_matmuls
from .autotune.machine_load import busy_load, cores
from .autotune.timing_cache import TimingCache
from .autotune.tuner import tune_all
from .build_phases import phase
from .lower import Program
from .target import cpu_fingerprint, fingerprint_id
from .runtime.bf16_gemm import is_bf16_valued
from .runtime.feeds_io import gather_table_rows, random_inputs
from .tune_context import confirm_in_context
from .tune_whole import WHOLE_MARGIN, WholeModel
from .tune_vendor import tune_vendor_tactics

TUNED_DOMAIN, TUNED_OP = "infc.cpu", "TunedMatMul"


def _gemm_steps(program: Program):
    """(index, step, weight, the dtype its key tunes: float32 or BF16) of each MatMul with a constant weight."""
    rounded = bf16_valued(program.steps, program.inputs)
    for index, step in enumerate(program.steps):
        if step["op"] != "MatMul" or step.get("domain"):
            continue
        weight = program.weights.get(step["inputs"][1])
        if weight is not None and weight.ndim == 2 and weight.dtype == np.float32:
            is_bf16 = step["inputs"][0] in rounded and is_bf16_valued(weight)
            yield index, step, weight, BF16 if is_bf16 else "float32"


def _m_range(step: dict, shapes_by_level: dict) -> tuple[int, int] | None:
    ms = []
    for shapes in shapes_by_level.values():
        entry = shapes.get(step["inputs"][0])
        if entry is None:
            return None
        shape = entry[0]
        ms.append(int(np.prod(shape[:-1])) if len(shape) > 1 else 1)
    return min(ms), max(ms)


def _buckets_between(low: int, high: int, m_buckets) -> list[int]:
    # a level with no rows (a batch or past length of 0 in the profile) has nothing to tune
    first, last = bucket_of(max(low, 1), m_buckets), bucket_of(max(high, 1), m_buckets)
    return [b for b in m_buckets if first <= b <= last] or [last]


def tune_program(program: Program, shapes_by_level: dict, profile, options, log, feeds: dict | None = None,
                 whole_model: WholeModel | None = None, fp32_reference: dict | None = None) -> dict:
    """`feeds`: inputs at the profile's opt shapes for the in-context check of convolution tactics
    (seeded random ones when not given); `whole_model`: the lowered model, raced whole in onnxruntime
    there too (tune_whole.py); `fp32_reference`: a reduced-precision build's fp32 outputs on `feeds`
    (tune_context.py)."""
    target = fingerprint_id(cpu_fingerprint())
    cache = TimingCache(options.cache_dir / "timing_cache.json") if options.use_cache else None
    gemms_as_matmuls(program, shapes_by_level)  # Gemm steps with a constant weight are tuned too (the caller's shapes)
    # a GEMM reading a graph input (a model that starts with a MatMul) has its rows in the profile
    shapes_by_level = _with_graph_inputs(program, shapes_by_level, profile)
    plans = []  # (step index, weight name, [(bucket, key)])
    problems = {}
    for index, step, weight, dtype in _gemm_steps(program):
        m_range = _m_range(step, shapes_by_level)
        if m_range is None:
            continue
        k, n = weight.shape
        keys = []
        for bucket in _buckets_between(*m_range, profile.m_buckets):
            key = gemm_key(bucket, n, k, dtype, target, m_buckets=profile.m_buckets)
            problems.setdefault(str(key), key)
            keys.append((bucket, key))
        plans.append((index, step["inputs"][1], keys, dtype))
    reports, table = [], []
    if problems:
        report = tune_all([gemm_problem(key) for key in problems.values()], budget_s=profile.budget_s, cache=cache,
                          show_progress=options.show_progress)
        table = [_table_row(result) for result in report.results.values()]
        outputs = {o["name"] for o in program.outputs}
        for index, weight_name, keys, dtype in plans:
            # a bf16 GEMM whose output is only read rounded to bf16 rounds it itself: the program's
            # rounding step after it goes (runtime/cast_fold.fold_rounding)
            is_rounded = dtype == BF16 and rounded_by_readers(program.steps, program.steps[index]["outputs"][0], outputs)
            _rewrite_step(program, index, weight_name, [(bucket, report.results[str(key)]) for bucket, key in keys],
                          round_to=BF16_CODE if is_rounded else None)
        reports.append(report)
    spent = sum(r.time_s for r in reports)
    if not options.allow_fallback:  # --no-fallback: nothing runs in onnxruntime, tactics included
        return _tuning(table, reports, {}, cache, log)
    conv_rows, conv_report = tune_vendor_tactics(
        program, shapes_by_level, target, cache=cache, show_progress=options.show_progress,
        budget_s=None if profile.budget_s is None else max(profile.budget_s - spent, 0.0))
    table += conv_rows
    reports += [conv_report] if conv_report else []
    context = {}
    if any(step.get("tactic") for step in program.steps) or whole_model is not None:
        if feeds is None:
            rows = gather_table_rows(program.steps, {n: list(w.shape) for n, w in program.weights.items()})
            feeds = random_inputs(program.inputs, profile.shapes("opt"), rows, seed=1)
        with phase("timing onnxruntime tactics on the whole program", options.show_progress):
            context = confirm_in_context(program, feeds, shapes_by_level=shapes_by_level, cache=cache, target=target,
                                         whole_model=whole_model, fp32_reference=fp32_reference)
        timed = ", ".join(f"{label} {ms:.3g} ms" for label, ms in context["program_ms"].items())
        if context.get("whole_model"):
            log(f"the whole model runs in one onnxruntime session: {WHOLE_MARGIN:.0%} or more faster than every program "
                f"on infc's kernels at the opt shapes ({timed}); its outputs checked against " + _whole_reference(whole_model))
        elif not context["num_marked"]:
            log(f"infc's kernels kept over the whole model in onnxruntime ({timed})"
                + "".join(f"; not a candidate: {reason}" for reason in context["rejected_wrong"]))
        else:
            log(f"onnxruntime tactics: {context['num_kept']} of {context['num_marked']} convolution and GEMM steps"
                f"{' and ' + str(context['num_bridges']) + ' steps between them' if context['num_bridges'] else ''} run in "
                f"onnxruntime, in {context['num_sessions']} session{'' if context['num_sessions'] == 1 else 's'} (the program "
                f"at the opt shapes with the steps whose time alone, onnxruntime's over infc's, is: {timed})"
                + "".join(f"; not a candidate: {reason}" for reason in context["rejected_wrong"])
                + ("; the choice replayed from the timing cache, its outputs checked" if context["cached"] else ""))
    return _tuning(table, reports, context, cache, log)


def _tuning(table: list, reports: list, context: dict, cache: TimingCache | None, log) -> dict:
    stats = {"hits": sum(r.num_cache_hits for r in reports), "misses": sum(r.num_cache_misses for r in reports),
             "time_s": round(sum(r.time_s for r in reports), 3)}
    stats.update(_load_stats(cache, bool(reports or context), log))
    return {"table": table, "sections": {}, "cache_stats": stats, **({"meta": {"conv_tactics": context}} if context else {})}


def _load_stats(cache: TimingCache | None, timed: bool, log) -> dict:
    """The machine's load over the tuning where it mattered (machine_load.py): entries re-timed
    because a busy machine timed them, and the load of a busy machine timing this build."""
    stats = {}
    if cache is not None and cache.num_busy_retimed:
        stats["busy_retimed"] = cache.num_busy_retimed
    load = max(filter(None, (cache.busy_load if cache is not None else None, busy_load() if timed else None)), default=None)
    if load is not None:
        stats["busy_load"] = load
        log(f"warning: the machine was busy while tuning (1-minute load {load:g} on {cores()} cores): timings may "
            "favor slower kernels; " + ("the timing cache marks them, and a build on a quiet machine times them "
                                       "again" if cache is not None else "rebuild on a quiet machine"))
    return stats


def _with_graph_inputs(program: Program, shapes_by_level: dict, profile) -> dict:
    """The sample runs saw what the steps produce; the graph inputs' shapes are the profile's."""
    dtypes = {i["name"]: i.get("dtype") for i in program.inputs}
    merged = {}
    for level, seen in shapes_by_level.items():
        given = profile.shapes(level)
        merged[level] = {**{n: (tuple(given[n]), dtypes[n]) for n in dtypes if n in given and dtypes[n]}, **seen}
    return merged


def _rewrite_step(program: Program, index: int, weight_name: str, results, round_to: int | None = None) -> None:
    step = program.steps[index]
    weight = program.weights[weight_name]
    inputs = list(step["inputs"][:2])
    variants = []
    for bucket, result in results:
        packed_inputs = {}
        for packed_name, array in prepack(result.winner, weight).items():
            if array is weight or (array.shape == weight.shape and np.shares_memory(array, weight)):
                packed_inputs[packed_name] = 1  # the original weight, stored once
                continue
            value_name = f"{weight_name}@{result.winner.impl}{_block_suffix(result.winner)}"
            if value_name not in program.weights:
                program.weights[value_name] = array
            if value_name not in inputs:
                inputs.append(value_name)
            packed_inputs[packed_name] = inputs.index(value_name)
        variants.append({"m_max": bucket, "impl": result.winner.impl, "params": result.winner.kwargs(),
                         "packed": packed_inputs, "source": result.status})
    step.update({"op": TUNED_OP, "domain": TUNED_DOMAIN, "inputs": inputs, "kernel": "tuned_matmul",
                 "attrs": {"variants": variants, **({"round_to": round_to} if round_to else {})}})


def _block_suffix(config) -> str:
    block = config.param("block")
    return f"{block}" if block is not None else ""


def _table_row(result) -> dict:
    data = result.to_json()
    fields = data["key_fields"]
    shape = dict(fields["shape"]) if isinstance(fields.get("shape"), list) else fields.get("shape", {})
    return {"key": data["key"], "shape": f"M<={shape.get('M')} N={shape.get('N')} K={shape.get('K')}",
            "source": result.status, "winner": str(result.winner), "winner_pct_of_vendor": data["winner_percent_of_vendor"],
            "note": result.note,
            "candidates": [{"config": str(c.config), "pct_of_vendor": c_json["percent_of_vendor"], "status": c.status,
                            "median_us": None if c_json["median_s"] is None else round(c_json["median_s"] * 1e6, 2)}
                           for c, c_json in zip(result.candidates, data["candidates"])]}


def _whole_reference(whole_model) -> str:
    """What the kept whole model was checked against (tune_whole.py), in the build log's words."""
    if whole_model.reference is None:
        return "infc's program"
    if whole_model.is_reduced:  # its own rounding (int8 kernels summing in integers): held to fp32, not to infc
        return "the fp32 model's in onnxruntime, as close as infc's program"
    return "onnxruntime's of the model as given"
