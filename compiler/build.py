"""`infc build`: model -> optimized graph -> kernel program -> sample runs (shapes, memory plan)
-> GEMM tuning -> plan file, with the engine cache in front."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import __version__
from .atomic import atomic_path, check_writable
from .build_phases import phase
from .build_precision import PrecisionSettings, reduce_precision
from .engine_cache import EngineCache, default_cache_dir
from .errors import BadInput, InfcError, error_reason
from .fixed_reshape import fixed_reshape_hint
from .graph import import_graph
from .lower import Program, lower_graph, value_info
from .memory_plan import plan_memory
from .model_io import check_inference_mode, check_tensor_interface, load_model
from .optimize import optimize_model
from .plan.format import ArraySection, write_plan
from .plan.weight_encoding import encode as encode_weight
from .plan_report import kernel_name
from .profile import (Profile, check_profile_matches_model, default_profile, defaulted_dims_note, feeds_profile,
                      load_profile)
from .runtime.executor import Executor
from .runtime.feeds_io import check_feeds, feeds_digest, gather_table_rows, random_inputs
from .runtime.kernels import has_kernel
from .runtime.shape_contract import contradicts_shapes
from .target import target_fingerprint
from .precision_payoff import fp32_payoff
from .tune_whole import offer as offer_whole_model
from .tune_whole import original_outputs
from .tune_whole import prove as prove_whole_model
from .tune_whole import whole_model_offered
from .verify import compare_outputs, ort_session
from .verify_selection import selection_note

PLAN_KIND = "one_shot"


@dataclass
class BuildOptions:
    target: str = "cpu"
    precision: str = "fp32"
    allow_fallback: bool = True
    verify: bool = False
    use_cache: bool = True
    cache_dir: Path = field(default_factory=default_cache_dir)
    show_progress: bool = True
    precision_settings: PrecisionSettings = field(default_factory=PrecisionSettings)
    # --inputs: representative inputs for the sample runs and --verify (value-dependent models:
    # a sample rate that picks a branch, ids that index a table), by name, and where they came from
    sample_feeds: dict | None = None
    sample_feeds_source: str = "--inputs"

    def key_options(self) -> dict:
        """The options that change what a plan contains (and so its cache key)."""
        return {"target": self.target, "precision": self.precision, "allow_fallback": self.allow_fallback,
                **self.precision_settings.key_options(self.precision),
                **({"inputs": feeds_digest(self.sample_feeds)} if self.sample_feeds is not None else {}),
                **({} if whole_model_offered() else {"whole_model": False})}  # INFC_WHOLE_MODEL=0


def resolve_target(target: str, log=lambda msg: None) -> str:
    from .target import resolve_target as resolve  # auto: cuda only with CuPy and a device (target.py)

    return resolve(target, log)


def _table_rows(program: Program) -> dict[str, int]:
    return gather_table_rows(program.steps, {n: list(w.shape) for n, w in program.weights.items()})


def sample_run(program: Program, feeds: dict) -> tuple[dict, dict[str, tuple]]:
    """Run the program once, recording every tensor's shape and dtype (for the memory plan; sequences
    and optionals, which islands may pass between steps, are not planned)."""
    seen: dict[str, tuple] = {}

    def observe(name: str, value) -> None:
        if isinstance(value, np.ndarray):
            seen[name] = (tuple(value.shape), value.dtype.name)
    executor = Executor(program.steps, program.weights, program.opset, program.islands,
                        output_names=[o["name"] for o in program.outputs], observer=observe)
    return executor.run(feeds), seen


def weights_section(weights: dict[str, np.ndarray]) -> tuple[ArraySection, dict]:
    """All weights in one section, each 64-byte aligned, described by (offset, dtype, shape); the
    section is written from the arrays themselves (plan/format.py)."""
    table, parts, offset = {}, [], 0
    for name, array in weights.items():
        array = np.require(array, requirements="C")
        offset += (-offset) % 64
        table[name] = {"section": "weights", "offset": offset, "dtype": array.dtype.name, "shape": list(array.shape)}
        stored, encoding = encode_weight(array)  # bf16 values held in float32: their halves (plan/weight_encoding.py)
        if encoding:
            table[name]["encoding"] = encoding
        parts.append((offset, stored.reshape(-1).view(np.uint8)))  # its bytes, not copied
        offset += stored.nbytes
    return ArraySection(parts, offset), table


def build(model_path: str, profile_path: str | None, output: str, options: BuildOptions, log=lambda msg: None) -> dict:
    started = time.perf_counter()
    model_path = Path(model_path)
    output = Path(output)
    _check_output(output)
    target_notes: list[str] = []  # logged once the inputs are known good (an error stays one line)
    requested_target, options.target = options.target, resolve_target(options.target, target_notes.append)
    model = load_model(model_path)
    check_inference_mode(model, model_path)
    check_tensor_interface(model, model_path)
    graph_inputs = [value_info(t) for t in import_graph(model).inputs]
    initializer_names = {t.name for t in model.graph.initializer}
    defaulted = tuple(v.name for v in model.graph.input if v.name in initializer_names)  # constants of the plan
    given = None if options.sample_feeds is None else check_feeds(graph_inputs, options.sample_feeds,
                                                                  options.sample_feeds_source, "the model", defaulted)
    profile = (load_profile(profile_path) if profile_path else feeds_profile(given) if given
               else default_profile(graph_inputs))
    if options.precision_settings.lm_head != "auto" and options.precision not in ("int8", "w8"):
        raise BadInput(f"--lm-head applies to --precision int8 and w8 (this build is {options.precision})")
    if profile.decode:  # decoder plans: paged attention, KV cache in the runtime's block pool
        if requested_target == "auto" and options.target == "cuda":  # the device decode path is new: asked for by name
            log("decoder plan: --target auto builds for the CPU; --target cuda runs the decode loop's model on the GPU")
        options.target = "cuda" if requested_target == "cuda" else "cpu"
        from .decoder import build_decoder_plan  # noqa: PLC0415 - it imports helpers from this module
        handed = [model]  # the decoder build drops the loaded model once optimized: keep no reference here
        del model
        return build_decoder_plan(model_path, handed, profile, output, options, log)
    if options.precision_settings.lm_head != "auto":  # silently ignored otherwise: a plan its user did not ask for
        raise BadInput(f"{profile_path or model_path}: --lm-head applies to decoder plans (a profile with a "
                       "decode section); this build is one-shot")
    check_profile_matches_model(profile, graph_inputs, defaulted=defaulted)
    if not profile_path and given is None and (note := defaulted_dims_note(graph_inputs)):
        target_notes.append(note)
    for note in target_notes:
        log(note)
    fingerprint = target_fingerprint(options.target)
    cache, components, lookup, report, hit = cache_front(model_path, profile, options.key_options(), fingerprint,
                                                          options, output, started, log)
    if hit:
        if options.verify:  # the cached plan, as `infc run` loads it, held to onnxruntime as a fresh build's is
            with phase("verifying the cached plan against onnxruntime", options.show_progress):
                hit["verify"] = _verify_plan_file(model_path, model, output, profile, given)
            hit["build_s"] = round(time.perf_counter() - started, 4)  # the check is part of the command's time
        return hit

    spin = options.show_progress
    with phase("optimizing the graph", spin) as update:
        optimized = optimize_model(model, progress=lambda stage, rule: update(f"optimizing: {stage} / {rule}"))
    with phase(f"reducing precision to {options.precision}", spin and options.precision != "fp32"):
        precision = reduce_precision(model, optimized.model, profile, options.precision, options.precision_settings, log)
    with phase("lowering to kernels", spin):
        graph = import_graph(precision.model)
        program = lower_graph(graph, has_kernel, allow_fallback=options.allow_fallback)
    # the whole model, raced in one onnxruntime session by the CPU tuner (tune_whole.py): at fp32 the
    # optimized model as it is, in reduced precision the converted one before its constants were
    # folded; either way a QDQ model keeps the int8 weights onnxruntime's int8 kernels read
    is_reduced = options.precision != "fp32"
    # (at fp32 also the model as given: onnxruntime may run its own fusions of it faster than infc's)
    whole = (offer_whole_model(precision.vendor_model if is_reduced else optimized.model, is_reduced,
                               as_given=None if is_reduced else model)
             if options.target != "cuda" and options.allow_fallback else None)
    # the program holds the weights now: the optimized model's copies go (the given model stays, the
    # reference of --verify and of the precision report)
    del graph, optimized
    precision.model = precision.vendor_model = None
    precision_meta = precision.finish(program, log)
    rows = _table_rows(program)
    shapes_by_level = {}
    for level in ("min", "opt", "max"):
        feeds = _level_feeds(program, profile.shapes(level), rows, given, seed=1)
        try:
            with phase(f"sample run at the profile's {level} shapes", spin):
                _, shapes_by_level[level] = sample_run(program, feeds)
        except Exception as exc:  # noqa: BLE001 - ours unless onnxruntime fails on the original too (below)
            _explain_sample_failure(model_path, model, program, feeds, feeds is given, level, exc, given)

    from .tune_plan import tune_program  # the tuner is heavy: only builds that miss the cache load it
    from .tune_vendor import drop_packings_onnxruntime_replaces

    cuda_fallback, payoff = None, None
    if options.target == "cuda":  # GPU tuning, cubins, self-check; auto falls back to a CPU plan (build_cuda.py)
        from .build_cuda import tune_cuda_or_fallback  # noqa: PLC0415
        tuning, cuda_fallback = tune_cuda_or_fallback(program, shapes_by_level, profile, options, log,
                                                      requested_target, tune_program, rows)
        if cuda_fallback:
            options.target, fingerprint = "cpu", target_fingerprint("cpu")
            report.update(target="cpu", fingerprint=fingerprint, cuda_fallback_reason=cuda_fallback)
    else:
        feeds = _level_feeds(program, profile.shapes("opt"), rows, given, seed=1)
        if whole is not None:  # run once apart first; held to onnxruntime on the model as given (tune_whole.py)
            refused = prove_whole_model(whole, model, feeds)
            if refused:
                log(f"the whole model is not raced in onnxruntime: {refused}")
                whole = None
            elif whole.form_ms:
                log(f"the whole model races {whole.form}{' at 1 thread' if whole.threads else ''} (onnxruntime: " +
                    ", ".join(f"{form} {ms:.3g} ms" for form, ms in whole.form_ms.items()) + ")")
        fp32_reference = None  # a reduced-precision program's variants round otherwise: held to fp32 (tune_context.py)
        if is_reduced:
            fp32_reference = whole.reference if whole is not None and whole.reference is not None else original_outputs(model, feeds)
        tuning = tune_program(program, shapes_by_level, profile, options, log, feeds=feeds, whole_model=whole,
                              fp32_reference=fp32_reference)
        drop_packings_onnxruntime_replaces(program)
        if is_reduced and precision_meta:  # is the reduced precision faster than fp32 at all? (precision_payoff.py)
            with phase("timing the fp32 model in onnxruntime", spin):  # the report says when it does not pay
                payoff = fp32_payoff(model, feeds, tuning.get("meta", {}))
    del whole
    is_whole = bool(tuning.get("meta", {}).get("conv_tactics", {}).get("whole_model"))
    if is_whole and precision_meta:
        precision_meta = precision.finish(program, log)  # the accuracy of what the plan now runs
        precision_meta["compute"] = "onnxruntime's own kernels over the whole reduced-precision model (tune_whole.py)"
    if payoff and precision_meta:
        precision_meta["payoff"] = payoff
    # planned once the program is final: tuning may reorder its steps (tune_context.py) or make it one session
    max_shapes = shapes_by_level["max"]
    sizes = {n: int(np.prod(s)) * np.dtype(d).itemsize for n, (s, d) in max_shapes.items()
             if n not in program.weights and n not in {i["name"] for i in program.inputs}}
    memory = plan_memory(program.steps, [o["name"] for o in program.outputs], sizes,
                         {k: list(v) for k, v in profile.shapes("max").items()})
    blob, weight_table = weights_section(program.weights)
    meta = {
        "infc_version": __version__, "kind": PLAN_KIND, "target": fingerprint, "opset": program.opset,
        "model": {"name": model_path.name, "sha256": components["model"]}, "profile": profile.normalized(),
        "options": options.key_options(), "inputs": program.inputs, "outputs": program.outputs,
        "program": program.steps, "weights": weight_table, "memory": memory.to_json(),
        **({"defaulted_inputs": list(defaulted)} if defaulted else {}),
        "tuning": tuning["table"], "fallback_ops": program.fallback_ops,
        "precision": precision_meta,
        "value_shapes": {level: {n: list(s) for n, (s, _) in shapes.items()} for level, shapes in shapes_by_level.items()},
        **tuning.get("meta", {}),
    }
    sections = {"weights": blob, **tuning["sections"], **program.islands}
    with phase("verifying the plan against onnxruntime", spin and options.verify):
        verify = (_verify(model_path, model, program, profile, tuning.get("executor"), given, optimized_reference=is_whole)
                  if options.verify else None)
    with phase(f"writing {output.name}", spin):
        write_plan(output, meta, sections)
    if options.use_cache and not cuda_fallback:  # a fallback plan is not what this cache key promises
        busy = tuning["cache_stats"].get("busy_load")  # a quiet machine's build re-tunes it (engine_cache.lookup)
        cache.store(lookup.key, output, model_path, components,
                    {"summary": _summary(meta), **({"busy_load": busy} if busy is not None else {})})
    return {**report, "cache_hit": False, "cache_reason": lookup.reason if lookup else "disabled",
            "build_s": round(time.perf_counter() - started, 4), **_summary(meta),
            "timing_cache": tuning["cache_stats"], **({"verify": verify} if verify else {}),
            **({"cuda_self_check": tuning["self_check"]} if "self_check" in tuning else {}),
            **({"precision": precision_meta} if precision_meta else {})}


def cache_front(model_path: Path, profile: Profile, key_options: dict, fingerprint: dict, options: BuildOptions,
                output: Path, started: float, log):
    """The engine cache in front of a build: on a hit the plan is copied to `output` and the finished
    report is returned as `hit`; on a miss the reason is logged and `hit` is None."""
    cache = EngineCache(options.cache_dir)
    if options.use_cache:  # before any work: a build that cannot store its plan and timings fails at once
        try:
            check_writable(options.cache_dir, make_folder=True)
        except BadInput as exc:
            raise BadInput(f"{exc} (the engine cache folder: give --cache-dir DIR, or --no-cache)") from None
    components = cache.components(model_path, profile.digest(), key_options, fingerprint, __version__)
    lookup = cache.lookup(model_path, components) if options.use_cache else None
    report = {"plan": str(output), "target": options.target, "fingerprint": fingerprint, "cache_key": lookup.key if lookup else None}
    if lookup and lookup.hit:
        _copy_atomic(lookup.plan_path, output)
        hit = {**report, "cache_hit": True, "cache_reason": "hit", "build_s": round(time.perf_counter() - started, 4),
               **_summary_from_cache(cache, lookup.key)}
        return cache, components, lookup, report, hit
    log(f"engine cache miss: {lookup.reason}" if lookup else "engine cache disabled (--no-cache)")
    return cache, components, lookup, report, None


def _summary(meta: dict) -> dict:
    return {"kernels": [{"step": s.get("name"), "op": s["op"], "kernel": kernel_name(s)} for s in meta["program"]],
            "tuning": meta["tuning"], "fallback_ops": meta["fallback_ops"],
            **({"conv_tactics": meta["conv_tactics"]} if meta.get("conv_tactics") else {}),
            "memory": {k: meta["memory"][k] for k in ("arena_bytes", "sum_activation_bytes")}}


def _summary_from_cache(cache: EngineCache, key: str) -> dict:
    for entry in cache.entries():
        if entry.get("key") == key:
            return entry.get("summary", {})
    return {}


def _level_feeds(program: Program, shapes: dict, rows: dict, given: dict | None, seed: int) -> dict:
    """The given inputs where they have the level's shapes, else seeded random ones."""
    if given is not None and all(tuple(given[n].shape) == tuple(shape) for n, shape in shapes.items() if n in given):
        return given
    return random_inputs(program.inputs, shapes, rows, seed=seed)


def _explain_sample_failure(model_path: Path, model, program: Program, feeds: dict, is_given: bool, level: str,
                            exc: Exception, given: dict | None = None) -> None:
    """A sample run failed: when onnxruntime cannot run the original model on the same random
    inputs either, the inputs are at fault (bad input, say what to do); otherwise it is ours.
    `given`: the --inputs, given but with other shapes than this level's, so random ones ran."""
    if is_given:
        if isinstance(exc, BadInput):  # the given inputs do not fit the model's shapes
            raise BadInput(f"{model_path}: {exc}") from exc
        raise exc
    try:
        session = ort_session(model)
    except BadInput as load_exc:  # an island is the model's own nodes: onnxruntime refuses them as it refuses the model
        raise BadInput(f"{model_path}: the ops infc has no kernel for run in onnxruntime, which refuses the model: "
                       f"{load_exc}") from None
    try:
        session.run(None, feeds)
    except Exception as ort_exc:  # noqa: BLE001 - its message is the explanation
        reason = error_reason(ort_exc, limit=500)  # onnxruntime's shape messages end with the shapes
        hint = _sample_failure_hint(model, ort_exc, given)
        raise BadInput(f"{model_path}: the model does not run on random inputs at the profile's {level} shapes "
                       f"(onnxruntime fails too: {reason}); {hint}") from None
    raise exc


def _sample_failure_hint(model, ort_exc: Exception, given: dict | None) -> str:
    """What to do about a model that onnxruntime cannot run at a profile level either."""
    if hint := fixed_reshape_hint(model, str(ort_exc)):
        return hint
    if given is None and contradicts_shapes(ort_exc):  # no values fix shapes that contradict each other
        return ("the model does not take these shapes: profile only shapes it runs at (a TorchScript trace "
                "fixes some lengths at export), or export it again with dynamic dims")
    if given is None:
        return "give representative inputs with --inputs FEEDS.npz"
    # given inputs stand in only at their own shapes: at other levels say so, not "give --inputs"
    return ("--inputs stand in only at the profile level whose shapes they have ("
            + ", ".join(f"{n} {list(a.shape)}" for n, a in given.items())
            + "): give a profile whose min, opt and max are their shapes, or leave --profile out")


def _verify(model_path: Path, model, program: Program, profile: Profile, executor=None, given: dict | None = None,
            optimized_reference: bool = False) -> dict:
    """`executor`: the cuda plan's device executor (the plan is verified as it will run);
    `optimized_reference`: against onnxruntime with its graph optimizations on, as a plan that runs
    the whole model in onnxruntime was checked (tune_whole.py), else with them off (the model's
    arithmetic as written)."""
    feeds = _level_feeds(program, profile.shapes("opt"), _table_rows(program), given, seed=7)
    names = [o["name"] for o in program.outputs]
    expected = _reference_outputs(model_path, model, names, feeds, optimized_reference)
    executor = executor or Executor(program.steps, program.weights, program.opset, program.islands, output_names=names)
    actual = executor.run(feeds)
    diffs = compare_outputs(names, expected, [actual[n] for n in names])
    note = selection_note(model.graph, diffs)
    return {"max_abs_diff": max(d.max_abs_diff for d in diffs), "max_rel_diff": max(d.max_rel_diff for d in diffs),
            "outputs": [d.to_json() for d in diffs],
            "reference": f"onnxruntime, graph optimizations {'on' if optimized_reference else 'off'}",
            **({"note": note} if note else {})}


def _verify_plan_file(model_path: Path, model, plan_path: Path, profile: Profile, given: dict | None) -> dict:
    from .runtime.session import PlanSession, _weights

    session = PlanSession(plan_path)
    meta = session.plan.meta
    program = Program(meta["program"], _weights(session.plan), meta["inputs"], meta["outputs"], meta.get("opset", 17))
    is_whole = bool(meta.get("conv_tactics", {}).get("whole_model"))
    return _verify(model_path, model, program, profile, session.executor, given, optimized_reference=is_whole)


def _reference_outputs(model_path: Path, model, names, feeds, optimize: bool):
    """onnxruntime's outputs for --verify. Where onnxruntime refuses or fails the model (a dynamo
    istft: int32 ScatterND indices) though infc runs it, the error says the plan builds without
    --verify; failures of the plan itself are not relabelled so (they are the plan's)."""
    try:
        return ort_session(model, optimize=optimize).run(names, feeds)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's reason, in one line
        reason = str(exc) if isinstance(exc, InfcError) else f"onnxruntime cannot run the model ({error_reason(exc)})"
        raise BadInput(f"{model_path}: --verify: {reason}; the plan builds without --verify") from None


def _check_output(output: Path) -> None:
    folder = output.parent if str(output.parent) else Path(".")
    if not folder.is_dir():
        raise BadInput(f"{output}: output folder '{folder}' does not exist")
    if output.is_dir():
        raise BadInput(f"{output}: is a directory")
    if not os.access(folder, os.W_OK):
        raise BadInput(f"{output}: output folder '{folder}' is not writable")
    check_writable(output)


def _copy_atomic(source: Path, target: Path) -> None:
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)
