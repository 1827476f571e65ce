"""Vendor tactics for a CPU plan: each float32 Conv / FusedConv with constant weights
(autotune/cpu_conv.py, together with the elementwise step the executor would fuse into it as an
epilogue) and each tuned GEMM step (autotune/cpu_gemm_vendor.py) is timed on infc's kernel and on
onnxruntime's at every distinct input shape its profile reaches (min, opt and max, not the opt
shape alone), and the step is marked `"tactic": "onnxruntime"` (with `"tactic_threads"` and its
time ratio, onnxruntime's over infc's) whenever an onnxruntime candidate was timed. A bf16 plan's
convolution whose operands hold bf16 values also races infc's kernel on AMX-BF16 tiles, and is
marked `"bf16_tiles": true` when that was infc's faster kernel (at most of its shapes).

Which marks stay is decided on the whole program (tune_context.py). Steps keep their inputs and
weights as they are: the runtime builds the sessions at load (runtime/vendor_op.py)."""

from __future__ import annotations

import math

import numpy as np

from .autotune import cpu_gemm_vendor
from .autotune.cpu_conv import NATIVE, TILES, conv_key, conv_problem, macs, then_name
from .autotune.tuner import TuneReport, tune_all
from .bf16_sites import bf16_valued
from .lower import Program
from .runtime.bf16_gemm import is_bf16_valued
from .runtime.kernels.common import decode_attrs
from .runtime.kernels.conv_epilogue import epilogue_pairs
from .runtime.vendor_op import TACTIC, is_conv_step

LEVELS = ("opt", "min", "max")  # opt first: it breaks ties
TACTIC_FIELDS = ("tactic", "tactic_threads", "tactic_ratio", "tactic_group", "tactic_dtypes", "tactic_ranks",
                 "tactic_lengths")
# Smaller steps are not timed alone (a session call costs ~30 us, about all of their time): they are
# marked untimed and run in onnxruntime only in the "all" subset, inside runs of other marked steps.
MIN_MACS = 1 << 20


def _conv_candidates(program: Program, shapes_by_level: dict):
    """(step index, decoded attrs, {level: (x shape, z shape or None)}) for each convolution infc may hand to onnxruntime."""
    for index, step in enumerate(program.steps):
        if not is_conv_step(step) or step.get("tactic"):
            continue
        inputs = step["inputs"]
        w = program.weights.get(inputs[1]) if len(inputs) > 1 else None
        bias_name = inputs[2] if len(inputs) > 2 else ""
        if w is None or w.dtype != np.float32 or w.ndim < 3 or (bias_name and bias_name not in program.weights):
            continue
        if inputs[0] in program.weights or (len(inputs) > 3 and inputs[3] in program.weights):
            continue  # a constant input: the fold passes left it for a reason; keep infc's kernel
        shapes = {}
        for level in LEVELS:
            seen = shapes_by_level.get(level, {})
            x = seen.get(inputs[0])
            z = seen.get(inputs[3]) if len(inputs) > 3 and inputs[3] else None
            if x is None or x[1] != "float32" or (len(inputs) > 3 and inputs[3] and z is None):
                break
            if math.prod(x[0]) == 0:
                break
            shapes[level] = (tuple(x[0]), None if z is None else tuple(z[0]))
        else:
            out = shapes_by_level.get("opt", {}).get(step["outputs"][0])
            if out is not None and macs(w.shape, out[0]) < MIN_MACS:
                _mark_untimed(step)
                continue
            yield index, decode_attrs(step.get("attrs") or {}), shapes


def _gemm_candidates(program: Program, shapes_by_level: dict):
    """(step index, {level: activation shape}) for each tuned GEMM step large enough to time."""
    for index, step in enumerate(program.steps):
        if (step.get("domain"), step["op"]) != ("infc.cpu", "TunedMatMul") or step.get("tactic"):
            continue
        w = program.weights.get(step["inputs"][1])
        if w is None or w.ndim != 2 or w.dtype != np.float32:
            continue
        shapes = {}
        for level in LEVELS:
            a = shapes_by_level.get(level, {}).get(step["inputs"][0])
            if a is None or a[1] != "float32" or len(a[0]) < 1 or math.prod(a[0]) == 0:
                break
            shapes[level] = tuple(a[0])
        else:
            if math.prod(shapes["opt"]) * w.shape[1] >= MIN_MACS:
                yield index, shapes
            else:
                _mark_untimed(step)


def tune_vendor_tactics(program: Program, shapes_by_level: dict, target: str, *, budget_s, cache, show_progress: bool,
                        bench_fn=None) -> tuple[list, TuneReport | None]:
    """Marks the steps onnxruntime can run, with their time ratios; returns (table rows, the tuner's report)."""
    _mark_untimed_steps(program)
    plans, problems = _conv_problems(program, shapes_by_level, target)
    for index, shapes in _gemm_candidates(program, shapes_by_level):
        step = program.steps[index]
        k, n = program.weights[step["inputs"][1]].shape
        keys = []
        for a_shape in shapes.values():
            m = math.prod(a_shape[:-1])
            key = cpu_gemm_vendor.gemm_step_key(m, k, n, cpu_gemm_vendor.native_recipe(step["attrs"], m), target)
            if str(key) not in problems:
                problems[str(key)] = cpu_gemm_vendor.gemm_step_problem(key, step, program.weights, a_shape, program.opset)
            keys.append(str(key))
        plans.append((index, list(dict.fromkeys(keys))))
    if not problems:
        return [], None
    report = tune_all(problems.values(), bench_fn, budget_s=budget_s, cache=cache, show_progress=show_progress)
    for index, keys in plans:
        results = [report.results[key] for key in keys]
        _mark_tiles(program.steps[index], results)
        _mark(program.steps[index], results)
    return [table_row(result) for result in report.results.values()], report


def _conv_problems(program: Program, shapes_by_level: dict, target: str) -> tuple[list, dict]:
    output_names = {o["name"] for o in program.outputs}
    pairs = epilogue_pairs(program.steps, program.weights, output_names)
    plans = []  # (step index, [keys by level])
    problems = {}
    rounded = bf16_valued(program.steps, program.inputs)
    for index, attrs, shapes in _conv_candidates(program, shapes_by_level):
        step = program.steps[index]
        inputs = step["inputs"]
        w = program.weights[inputs[1]]
        dtype = "bfloat16" if inputs[0] in rounded and is_bf16_valued(w) else "float32"
        bias = program.weights.get(inputs[2]) if len(inputs) > 2 and inputs[2] else None
        then = None
        if index in pairs:
            reader, merged = pairs[index]
            then = (program.steps[reader], merged, program.weights)
        keys = []
        for x_shape, z_shape in shapes.values():
            key = conv_key(x_shape, w.shape, attrs, bias is not None, z_shape is not None, target,
                           then=then_name(then[0]) if then else "", dtype=dtype)
            if str(key) not in problems:
                problems[str(key)] = conv_problem(key, step["op"], step.get("domain") or "", attrs, x_shape, w, bias,
                                                  z_shape, program.opset, then=then)
            keys.append(str(key))
        plans.append((index, list(dict.fromkeys(keys))))
    return plans, problems


# A model quantized by another tool (QOperator) computes its convolutions and GEMMs in these ops;
# onnxruntime's int8 kernels are their vendor library. infc sums them exactly in float BLAS, so no
# float64 check or timing alone tells more than the program does: they are marked untimed, and the
# in-context check decides (with the bridges around them).
INTEGER_STEPS = frozenset({"QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger"})


# Recurrent layers: infc's kernels loop over time in Python (a few NumPy calls per step) where
# onnxruntime's loop is compiled: a Conv1d + LSTM model ran 26x slower than onnxruntime, a
# bidirectional GRU 8x. Their whole-sequence time depends on the sequence length, not on a GEMM size
# the tuner could key, so they are marked untimed too and the in-context check decides.
RECURRENT_STEPS = frozenset({"RNN", "GRU", "LSTM"})


def _mark_untimed_steps(program: Program) -> None:
    for step in program.steps:
        if (step.get("domain") or "") == "" and step["op"] in INTEGER_STEPS | RECURRENT_STEPS and not step.get("tactic"):
            _mark_untimed(step)


def _mark_untimed(step: dict) -> None:
    """A step too small to time alone (a session call is about all of its time) may still run in
    onnxruntime inside a run of marked steps: it joins the context check's "all" subset only."""
    step["tactic"] = TACTIC
    step["tactic_ratio"] = None


def _mark(step: dict, results: list) -> None:
    """Marks a step with its time ratio: onnxruntime's best candidate over infc's, the geometric mean
    over the shapes timed. Which marks stay is decided in context
    (confirm_in_context): one that onnxruntime loses alone can win inside a run of them in one
    session, which keeps its blocked layout from step to step."""
    ratios, threads = [], []
    for result in results:
        native = _best_native(result)
        vendors = [c for c in result.candidates if not _is_native(c.config) and c.is_ok]
        if any(c.status.startswith(("wrong", "failed")) for c in result.candidates if not _is_native(c.config)):
            return  # onnxruntime's kernel failed or computed something else here: the step stays infc's
        if native is None or not native.is_ok or not vendors or native.median_s <= 0:
            continue
        best = min(vendors, key=lambda c: (c.median_s, str(c.config)))
        ratios.append(best.median_s / native.median_s)
        threads.append(best.config.param("threads"))
    if not ratios:
        if results and all(result.status.startswith("untuned") for result in results):
            _mark_untimed(step)  # the budget ran out before it: it may still join a run, in the "all" subset
        return
    ratio = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    step["tactic"] = TACTIC
    chosen = max(set(threads), key=lambda t: (threads.count(t), t == threads[0]))  # the shapes' majority; opt breaks ties
    if chosen:
        step["tactic_threads"] = int(chosen)
    step["tactic_ratio"] = round(ratio, 3)


def _is_native(config) -> bool:
    return config.impl == NATIVE.impl


def _best_native(result):
    """infc's fastest kernel that computed the right thing (its plain one or, for a bf16 site, on AMX tiles)."""
    natives = [c for c in result.candidates if _is_native(c.config) and c.is_ok and c.median_s > 0]
    return min(natives, key=lambda c: (c.median_s, str(c.config))) if natives else result.result_of(NATIVE)


def _mark_tiles(step: dict, results: list) -> None:
    """`bf16_tiles` when infc's kernel on AMX tiles beat its float32 one at most of the shapes timed (opt first breaks ties)."""
    votes = [best.config == TILES for best in (_best_native(result) for result in results) if best is not None and best.is_ok]
    if votes and (sum(votes) * 2 > len(votes) or (sum(votes) * 2 == len(votes) and votes[0])):
        step["bf16_tiles"] = True


def table_row(result) -> dict:
    data = result.to_json()
    shape = data["key_fields"]["shape"]
    if data["key_fields"]["op"] == cpu_gemm_vendor.OP:
        text = f"GEMM step M={shape['M']} N={shape['N']} K={shape['K']} ({data['key_fields']['epilogue']})"
        return _row(result, data, text)
    spatial = sorted(k for k in shape if k.startswith("X"))
    kernel = "x".join(str(shape[f"K{i}"]) for i in range(len(spatial)))
    strides = "x".join(str(shape[f"S{i}"]) for i in range(len(spatial)))
    text = (f"Conv {shape['N']}x{shape['C']}x{'x'.join(str(shape[k]) for k in spatial)} -> {shape['M']} "
            f"k{kernel} s{strides}{' g' + str(shape['G']) if shape['G'] != 1 else ''} {data['key_fields']['epilogue']}")
    return _row(result, data, text)


def _row(result, data: dict, text: str) -> dict:
    return {"key": data["key"], "shape": text, "source": result.status, "winner": str(result.winner),
            "winner_pct_of_vendor": data["winner_percent_of_vendor"], "note": result.note,
            "candidates": [{"config": str(c.config), "pct_of_vendor": c_json["percent_of_vendor"], "status": c.status,
                            "median_us": None if c_json["median_s"] is None else round(c_json["median_s"] * 1e6, 2)}
                           for c, c_json in zip(result.candidates, data["candidates"])]}


def drop_packings_onnxruntime_replaces(program: Program) -> int:
    """A TunedMatMul that the plan runs in onnxruntime reads only its original weight there: its
    tuned variants' packed copies (each as large as the weight: a 1.2 GB encoder's plan was 3.2 GB)
    leave the plan. Should its session not load at run time, the step falls back to a plain matmul
    on the weight. Returns how many packed weights left."""
    dropped = set()
    for step in program.steps:
        if step.get("tactic") == TACTIC and (step.get("domain"), step["op"]) == ("infc.cpu", "TunedMatMul"):
            dropped.update(step["inputs"][2:])
            step["inputs"] = step["inputs"][:2]
            step["attrs"] = {**step["attrs"], "variants": []}
    still_read = {name for step in program.steps for name in step["inputs"]} | {o["name"] for o in program.outputs}
    gone = [name for name in dropped if name in program.weights and name not in still_read]
    for name in gone:
        del program.weights[name]
    return len(gone)
