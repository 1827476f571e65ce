"""The cuda side of `infc build --target cuda`: GEMM sites of the program, GPU tuning per shape
bucket (generated kernels against cuBLAS, compiler/autotune/gpu_gemm.py), cubins of the winners
compiled for the device's architecture and stored as plan sections, and meta["cuda"] for the
runtime (runtime/cuda/plan_loader.py). The program's steps stay as they are, so the CPU executor can
still run (and --verify) the same plan data; the device executor reads meta["cuda"] on top.

A GEMM site is a MatMul with a constant 2-D weight, a Gemm with a constant B, or a group-1 Conv /
FusedConv (im2col: its weight reshaped is the (N, K) operand). In an fp16/bf16 plan the program
computes in fp32 from values rounded to the low type (compiler/build_precision.py); a site whose
weight holds such values runs on the tensor cores instead: A and W in the low type (exact, both
were rounded), fp32 accumulation and output, which the program's next Cast rounds as on the CPU.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import numpy as np

from .autotune.buckets import bucket_of
from .errors import InfcError
from .autotune.gpu_gemm import GpuTarget, gemm_key, gemm_problem, table_row
from .autotune.timing_cache import TimingCache
from .codegen.plan_kernels import CUBIN_SECTION
from .autotune.tuner import tune_all
from .lower import Program
from .runtime.cast_fold import LOW_CODES
from .runtime.cuda.gemm import weight_nk
from .target import cuda_fingerprint, fingerprint_id

CONV_OPS = {("", "Conv"), ("com.microsoft", "FusedConv")}


@dataclass(frozen=True)
class Site:
    step: int
    weight: str
    layout: str          # "kn" (transposed once at build time) or "nk" (as stored)
    n: int
    k: int
    m_range: tuple[int, int]
    dtype: str = "float32"  # the operands' type on the device: float32, or the plan's bfloat16 / float16


# `infc build --precision` -> the 16-bit type its GEMM sites run in on the device
LOW_PRECISION = {"fp16": "float16", "bf16": "bfloat16"}


def _m_of(step: dict, shapes: dict) -> int | None:
    key = ((step.get("domain") or ""), step["op"])
    if key in CONV_OPS:
        out = shapes.get(step["outputs"][0])
        return None if out is None or len(out[0]) < 3 else int(np.prod(out[0])) // int(out[0][1])
    entry = shapes.get(step["inputs"][0])
    if entry is None:
        return None
    shape = entry[0]
    if step["op"] == "Gemm":
        return int(shape[1] if (step.get("attrs") or {}).get("transA") else shape[0])
    return int(np.prod(shape[:-1])) if len(shape) > 1 else 1


def _holds_low_values(weight: np.ndarray, dtype: str | None) -> bool:
    """The fp32 weight is exactly a `dtype` tensor (the precision step rounded it; a pinned node's is not)."""
    if dtype is None:
        return False
    from .autotune.gpu_gemm import low_dtype  # noqa: PLC0415

    low = weight.astype(low_dtype(dtype))
    return bool(np.array_equal(low.astype(np.float32), weight) and np.isfinite(low.astype(np.float32)).all())


def gemm_sites(program: Program, shapes_by_level: dict, low: str | None = None) -> list[Site]:
    """The program's GEMM sites; with `low` (bfloat16 / float16) those whose weight holds low values run in it."""
    sites = []
    for index, step in enumerate(program.steps):
        key = ((step.get("domain") or ""), step["op"])
        attrs = step.get("attrs") or {}
        weight = program.weights.get(step["inputs"][1]) if len(step["inputs"]) > 1 else None
        if weight is None or weight.dtype != np.float32:
            continue
        if key == ("", "MatMul") and weight.ndim == 2:
            layout, (k, n) = "kn", weight.shape
        elif key == ("", "Gemm") and weight.ndim == 2:
            layout = "nk" if attrs.get("transB") else "kn"
            n, k = weight.shape if layout == "nk" else weight.shape[::-1]
        elif key in CONV_OPS and weight.ndim >= 3 and attrs.get("group", 1) == 1:
            layout, n, k = "nk", weight.shape[0], int(np.prod(weight.shape[1:]))
        else:
            continue
        ms = [_m_of(step, shapes) for shapes in shapes_by_level.values()]
        if None in ms:
            continue
        dtype = low if _holds_low_values(weight, low) else "float32"
        sites.append(Site(index, step["inputs"][1], layout, int(n), int(k), (min(ms), max(ms)), dtype))
    return sites


def _buckets(low: int, high: int, m_buckets) -> list[int]:
    # a level with no rows (a batch or past length of 0 in the profile) has nothing to tune
    first, last = bucket_of(max(low, 1), m_buckets), bucket_of(max(high, 1), m_buckets)
    return [b for b in m_buckets if first <= b <= last] or [last]


def cubin_cache(cache_dir):
    """Compiled kernels by content, beside the engine and timing caches."""
    from .codegen.cache import CubinCache  # noqa: PLC0415

    return CubinCache(cache_dir / "cubins")


def device_target(fingerprint: dict, cache_dir) -> GpuTarget:
    """The real device: CuPy, kernels compiled for its arch and loaded from bytes, CUDA-event timing."""
    import cupy  # noqa: PLC0415

    from .autotune.gpu_bench import CudaEventBench  # noqa: PLC0415
    from .codegen.compile import cubin_for  # noqa: PLC0415
    from .runtime.cuda.launcher import GemmKernel, load_cubin  # noqa: PLC0415

    cubins = cubin_cache(cache_dir)

    def load(variant):
        from .codegen.generate import kernel_name  # noqa: PLC0415

        cubin, _ = cubin_for(variant, fingerprint["arch"], cubins)
        return GemmKernel(None, kernel_name(variant), variant.params, fingerprint["sms"], module=load_cubin(cubin))

    l2 = cupy.cuda.Device().attributes.get("L2CacheSize", 60 * 2**20)
    return GpuTarget(cupy, fingerprint_id(fingerprint), load, CudaEventBench(cupy), l2_bytes=int(l2))


def tune_cuda(program: Program, shapes_by_level: dict, profile, options, log, target: GpuTarget | None = None,
              fingerprint: dict | None = None) -> dict:
    """build.py's tuning step for target cuda: {"table", "sections", "cache_stats", "meta"}.
    `target` and `fingerprint` are injected by tests; a real build uses the device."""
    from .codegen.compile import cubin_for  # noqa: PLC0415
    from .codegen.generate import kernel_name  # noqa: PLC0415
    from .codegen.epilogue_match import match_epilogue  # noqa: PLC0415
    from .codegen.plan_kernels import EpilogueFuser, compile_chains, compile_rows  # noqa: PLC0415
    from .codegen.variants import variant_named  # noqa: PLC0415

    fingerprint = fingerprint or cuda_fingerprint()
    target = target or device_target(fingerprint, options.cache_dir)
    sites = gemm_sites(program, shapes_by_level, LOW_PRECISION.get(options.precision))
    problems, per_site = {}, []
    for site in sites:
        keys = []
        for bucket in _buckets(*site.m_range, profile.m_buckets):
            key = gemm_key(bucket, site.n, site.k, site.dtype, target.fingerprint_id, m_buckets=profile.m_buckets)
            problems.setdefault(str(key), key)
            keys.append((bucket, str(key)))
        per_site.append((site, keys))
    cache = TimingCache(options.cache_dir / "timing_cache.json") if options.use_cache else None
    report = tune_all([gemm_problem(key, target) for key in problems.values()], target.bench,
                      budget_s=profile.budget_s, cache=cache, show_progress=options.show_progress)
    low_sites = sum(site.dtype != "float32" for site in sites)
    log(f"GPU GEMM tuning: {len(problems)} shape buckets, {report.num_cache_hits} from the timing cache"
        + (f"; {low_sites} of {len(sites)} sites in {LOW_PRECISION[options.precision]}" if low_sites else ""))

    gemms, used = [], set()
    cubins = cubin_cache(options.cache_dir)
    fuse = EpilogueFuser(fingerprint["arch"], cubins, log)  # codegen/plan_kernels.py
    output_names = {o["name"] for o in program.outputs}
    for site, keys in per_site:
        epilogue = match_epilogue(program.steps, site.step, program.weights, site.n, output_names, shapes_by_level,
                                  through_low=LOW_CODES.get(site.dtype))  # 16-bit sites: through their rounding
        choices = []
        for bucket, key in keys:
            winner = report.results[key].winner
            if winner.impl == "kernel":
                plain = str(winner.param("variant"))
                fused = fuse(plain, epilogue)
                used.add(fused or plain)
                choices.append({"m_max": bucket, "impl": "kernel", "kernel": fused or plain, "fused": bool(fused)})
            else:
                choices.append({"m_max": bucket, "impl": "cublas"})
        w_nk = site.weight
        if site.layout == "kn":  # the (N, K) copy the device reads; the CPU program keeps (K, N)
            w_nk = f"{site.weight}@nk"
            program.weights.setdefault(w_nk, weight_nk(program.weights[site.weight], "kn"))
        entry = {"step": site.step, "w_nk": w_nk, "N": site.n, "K": site.k, "choices": choices,
                 **({"dtype": site.dtype} if site.dtype != "float32" else {})}
        if epilogue is not None and any(c.get("fused") for c in choices):  # cuBLAS winners keep the separate ops
            entry["epilogue"] = epilogue.to_json()
        gemms.append(entry)

    sections, kernels = {}, {}
    for name in sorted(used):
        variant = variant_named(name)
        cubin, info = cubin_for(variant, fingerprint["arch"], cubins)
        section = CUBIN_SECTION + name
        sections[section] = cubin
        kernels[name] = {"section": section, "entry": kernel_name(variant), "params": variant.params,
                         "arch": fingerprint["arch"], "sha256": hashlib.sha256(cubin).hexdigest(), **info}
    absorbed = {i for entry in gemms for i in (entry.get("epilogue") or {}).get("absorbed", ())}
    chain_sections, chains = compile_chains(program, shapes_by_level, fingerprint["arch"], cubins, log, absorbed)
    sections.update(chain_sections)
    row_sections, rows = compile_rows(program, fingerprint["arch"], cubins, log)
    sections.update(row_sections)
    return {"table": [table_row(r) for r in report.results.values()], "sections": sections, "fingerprint": fingerprint,
            "cache_stats": {"hits": report.num_cache_hits, "misses": report.num_cache_misses,
                            "time_s": round(report.time_s, 3)},
            "meta": {"cuda": {"kernels": kernels, "gemms": gemms, "chains": chains, "rows": rows,
                              "host_ops": host_ops(program)}}}



def host_ops(program: Program) -> list[str]:
    """Ops the device executor will run on the host with copies (`infc inspect` lists them)."""
    from .runtime.cuda.executor import placement  # noqa: PLC0415

    return sorted({label for label, where in placement(program.steps, program.weights) if where == "host fallback"})



# ---- the build's safety net ----------------------------------------------------------------------
SELF_CHECK_SEED = 29
SELF_CHECK_TOLERANCE = {"float32": 1e-4, "float64": 1e-4, "float16": 2e-2, "bfloat16": 2e-2}


# --target auto keeps the cuda plan only when it runs faster than the CPU executor at the profile's
# opt shapes (a GPU plan of a tiny model can lose to launch and copy costs); off on the stand-in device
SPEED_GUARD = True
TIMING_RUNS, TIMING_BUDGET_S = 5, 2.0


class SelfCheckFailed(InfcError):
    """The cuda plan's outputs differ from the CPU executor's on the build's own random inputs."""


class SlowerThanCpu(InfcError):
    """Under --target auto: the checked cuda plan ran slower than the CPU executor."""


def tune_cuda_or_fallback(program: Program, shapes_by_level: dict, profile, options, log, requested: str,
                          tune_cpu, table_rows: dict) -> tuple[dict, str | None]:
    """(tuning, None) for a checked cuda plan, or (CPU tuning, why) when `requested` is auto and any part
    of the cuda build failed: a CuPy call, a compile, the tuning or the self-check. With an explicit
    --target cuda the failure is one `error:` line (exit 1 unless it is bad input)."""
    weights_before = set(program.weights)
    try:
        tuning = tune_cuda(program, shapes_by_level, profile, options, log)
        tuning["executor"], tuning["self_check"] = self_check(program, tuning, profile, table_rows,
                                                              LOW_PRECISION.get(options.precision))
        check = tuning["self_check"]
        timing = f"; {check['device_ms']:.3g} ms on the GPU, {check['cpu_ms']:.3g} ms on the CPU" if "cpu_ms" in check else ""
        log(f"cuda self-check: max rel diff {check['max_rel_diff']:.2g} against the CPU executor{timing}")
        if requested == "auto" and check.get("device_ms", 0.0) > check.get("cpu_ms", float("inf")):
            raise SlowerThanCpu(f"the cuda plan ran slower than the CPU ({check['device_ms']:.3g} ms against "
                                f"{check['cpu_ms']:.3g} ms at the profile's opt shapes)")
        return tuning, None
    except Exception as error:  # noqa: BLE001 - every failure of the GPU path has the same two outcomes
        reason = _one_line(error)
        if requested == "cuda":
            if isinstance(error, InfcError):
                raise type(error)(f"--target cuda: {reason}") from error
            raise InfcError(f"--target cuda: the cuda build failed: {reason}") from error
        for name in set(program.weights) - weights_before:  # the device's (N, K) weight copies
            del program.weights[name]
        why = reason if isinstance(error, SlowerThanCpu) else f"the cuda build failed: {reason}"
        log(f"target auto: cpu ({why}); this plan is not stored in the engine cache")
        return tune_cpu(program, shapes_by_level, profile, options, log), reason


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    message = text[0] if text else ""
    return message if isinstance(error, InfcError) else f"{type(error).__name__}: {message}"[:400]


def self_check(program: Program, tuning: dict, profile, table_rows: dict, low: str | None = None):
    """The plan as the runtime will load it, run by the device executor on seeded random inputs at the
    profile's opt shapes, against the CPU executor on the same program: (executor, summary). In an
    fp16/bf16 plan (`low`) float outputs get the low type's tolerance: both sides round every value
    to it, and a different summation order can round an element to the neighbouring value."""
    from .plan.format import Plan  # noqa: PLC0415
    from .runtime.cuda.plan_loader import device_executor  # noqa: PLC0415
    from .runtime.executor import Executor  # noqa: PLC0415
    from .runtime.feeds_io import random_inputs  # noqa: PLC0415
    from .verify import compare_outputs  # noqa: PLC0415

    names = [o["name"] for o in program.outputs]
    meta = {"program": program.steps, "outputs": program.outputs, "opset": program.opset,
            "target": tuning["fingerprint"], **tuning["meta"]}
    plan = Plan("cuda self-check", meta, {**tuning["sections"], **program.islands})
    executor = device_executor(plan, program.weights)
    feeds = random_inputs(program.inputs, profile.shapes("opt"), table_rows, seed=SELF_CHECK_SEED)
    expected = Executor(program.steps, program.weights, program.opset, program.islands, output_names=names).run(feeds)
    actual = executor.run(feeds)
    diffs = compare_outputs(names, [expected[n] for n in names], [actual[n] for n in names])
    for diff, name in zip(diffs, names):
        kind = np.asarray(expected[name]).dtype.name
        limit = SELF_CHECK_TOLERANCE.get(low if low and kind in SELF_CHECK_TOLERANCE else kind, 0.0)
        if not diff.max_rel_diff <= limit:  # NaN fails too
            raise SelfCheckFailed(f"cuda self-check: output '{name}' differs from the CPU executor by "
                                  f"{diff.max_rel_diff:.3g} relative (limit {limit:g}) at index {list(diff.worst_index)}")
    summary = {"max_rel_diff": max((d.max_rel_diff for d in diffs), default=0.0), "seed": SELF_CHECK_SEED}
    if SPEED_GUARD:
        cpu = Executor(program.steps, program.weights, program.opset, program.islands, output_names=names)
        summary.update(device_ms=_median_ms(executor, feeds), cpu_ms=_median_ms(cpu, feeds))
    return executor, summary


def _median_ms(executor, feeds) -> float:
    """Median wall time of a run (outputs on the host, so the device has finished), after a warm-up."""
    executor.run(feeds)
    times, deadline = [], time.perf_counter() + TIMING_BUDGET_S
    while len(times) < TIMING_RUNS and (not times or time.perf_counter() < deadline):
        start = time.perf_counter()
        executor.run(feeds)
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))
