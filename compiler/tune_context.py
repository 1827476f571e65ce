"""Which tactic marks a CPU plan keeps, decided on the whole program (tune_vendor.py marks the steps).

Timed alone, a step runs with its input in cache and onnxruntime's worker thread awake; in a
program neither holds, and consecutive marked steps run as one session (`"tactic_group"`), which
keeps onnxruntime's blocked layout between them: a step slower alone can pay there. So the program
runs at the opt shapes without marks and with the marks up to each TIERS ratio, each also with the
bridges that join its runs (tune_bridge.py), and with those and the shape arithmetic between them,
interleaved; every variant's outputs are checked
against the unmarked program's, and the fastest stays if it beats the unmarked program. The choice
is kept in the timing cache under a key of the program, feed shapes, target and infc's source, and
replayed by rebuilds (outputs still checked), so the same model and profile build the same plan.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import statistics
import time

import numpy as np
import onnx

from .autotune.config import Config
from .autotune.key import TuningKey
from .autotune.tuner import CandidateResult, TuneResult
from .lower import Program
from .runtime.vendor_op import TACTIC
from .step_order import clustered_order
from .tune_bridge import bridge_candidates, input_dtypes, input_lengths, input_ranks, with_bridges
from .tune_vendor import INTEGER_STEPS, TACTIC_FIELDS
from .tune_whole import WHOLE, WHOLE_KEEP, WHOLE_SECTION, WholeModel, accuracy_refusal, closeness_refusal, keep_whole, relative_distance, whole_step
from .tune_whole import wins as whole_wins

CONFIRM_BUDGET_S = 1.0  # per program variant, for the in-context check
CONFIRM_MIN_RUNS = 5
CONFIRM_MAX_RUNS = 200
CONFIRM_MARGIN = 0.03  # a marked program must be this much faster than the unmarked one, or the marks go
CONFIRM_DROP = 1.25  # after CONFIRM_MIN_RUNS rounds, a variant this much slower than the fastest stops running
# ... and after this long: five rounds of a 0.15 ms model are a millisecond, and one stall of a shared
# machine (a time slice given to another process, 10 ms) in three of them made silero-vad's whole
# model 11.6 ms in the race (0.15 ms timed apart), dropped and never timed again
CONFIRM_DROP_AFTER_S = 0.1
# Subsets of the marks tried in context: onnxruntime's time alone over infc's at most this (a step
# slower alone can pay in a run of them: one session, no layout change between them)
TIERS = (0.5, 0.75, 1.0, 1.5, math.inf)


def confirm_in_context(program: Program, feeds: dict, *, shapes_by_level: dict | None = None,
                       budget_s: float = CONFIRM_BUDGET_S, clock=time.perf_counter, cache=None, target: str = "",
                       whole_model: WholeModel | None = None, fp32_reference: dict | None = None) -> dict:
    """Times the program without its tactic marks and with nested subsets of them (the marks whose
    onnxruntime time was at most each TIERS fraction of infc's), each also with the bridges that
    join its runs (tune_bridge.py; `shapes_by_level` says which steps may), interleaved; keeps the
    fastest subset if it beats the unmarked program by CONFIRM_MARGIN, else drops every mark.
    With a timing `cache`, the choice for this very program, feed shapes, `target` and infc source
    is replayed from it (the outputs still checked), so rebuilds keep the same variant. `whole_model`:
    the lowered model, raced as one more variant (tune_whole.py: kept only by a margin, checked against
    its own reference where it has one). `fp32_reference`: in a reduced-precision build, the fp32
    model's outputs on `feeds` in onnxruntime; a variant that rounds otherwise than the program (see
    AGREE_RTOL_QUANTIZED) is then kept when it is about as close to them as the program is.
    Returns what was measured (for the build report)."""
    from .runtime.executor import Executor  # noqa: PLC0415

    marked = {index: step for index, step in enumerate(program.steps) if step.get("tactic")}
    if not marked and whole_model is None:
        return {}
    bridges = bridge_candidates(program, shapes_by_level or {})
    shape_bridges = bridge_candidates(program, shapes_by_level or {}, shape_steps=True)
    subsets = {"none": frozenset()}
    for tier in TIERS:
        chosen = frozenset(i for i, step in marked.items() if _ratio(step) <= tier)
        label = f"ratio<={tier:g}" if math.isfinite(tier) else "all"
        for keep, name in ((chosen, label), (with_bridges(len(program.steps), chosen, bridges), f"{label}+bridges"),
                           (with_bridges(len(program.steps), chosen, shape_bridges), f"{label}+bridges+shapes")):
            if keep and keep not in subsets.values():
                subsets[name] = keep
    if whole_model is not None:
        subsets[WHOLE] = WHOLE_KEEP
    names = [o["name"] for o in program.outputs]
    key = context_key(program, feeds, target) if cache is not None else None
    replayed = cache.get(key) if key is not None else None
    if replayed is not None and replayed.winner.impl in subsets:  # only it and the unmarked program: checked, not timed
        subsets = {label: subsets[label] for label in dict.fromkeys(("none", replayed.winner.impl))}

    dtypes = {index: input_dtypes(program.steps[index], shapes_by_level or {}, program.weights)
              for index in set(marked) | shape_bridges}
    static_inputs = {i["name"]: [d if isinstance(d, int) and d >= 0 else None for d in i["shape"]] for i in program.inputs
                     if i.get("shape") is not None and any(isinstance(d, int) and d >= 0 for d in i["shape"])}
    ranks = {index: input_ranks(program.steps[index], shapes_by_level or {}, program.weights, static_inputs)
             for index in set(marked) | shape_bridges}
    lengths = {index: input_lengths(program.steps[index], shapes_by_level or {}, program.weights)
               for index in set(marked) | shape_bridges}

    def executor(keep):
        if keep is WHOLE_KEEP:
            return Executor([whole_step(program, whole_model.threads)], {}, program.opset, {WHOLE_SECTION: whole_model.model_bytes}, output_names=names,
                            trial=True)
        steps = _with_marks(program.steps, keep, dtypes, ranks, lengths)
        return Executor(steps, program.weights, program.opset, program.islands, output_names=names, trial=True)

    sides, wrong = {}, []
    for label, keep in subsets.items():
        try:
            sides[label] = executor(keep)
        except Exception as exc:  # noqa: BLE001 - onnxruntime refused the whole model: not a variant
            wrong.append(f"{label}: {(str(exc).splitlines() or [type(exc).__name__])[0][:300]}")
            continue
        if sides[label].notes:  # onnxruntime refused a session (a bridge it cannot run): not a variant
            wrong.append(f"{label}: {sides.pop(label).notes[0]}")
    reference = sides["none"].run(feeds)  # also the warm-up of compiled kernels and sessions
    noise = _kernel_noise(program, feeds, reference, names)
    rtol = max(agreement_rtol(program.steps), min(NOISE_FACTOR * noise, AGREE_RTOL_QUANTIZED))
    if whole_model is not None:  # a quantized model's outputs move this much when its inputs move by an ulp
        rtol = max(rtol, min(NOISE_FACTOR * whole_model.reference_noise, AGREE_RTOL_GRID))
    for label, run in list(sides.items()):
        if label == "none":
            continue
        is_whole = label == WHOLE and whole_model.reference is not None
        try:  # a vendor step untimed alone was never checked against float64: this is its check
            outputs = run.run(feeds)
            if is_whole and whole_model.is_reduced:  # tune_whole.py: as close to fp32 as the program
                reason = accuracy_refusal(whole_model, outputs, reference, names)
            else:
                expected = whole_model.reference if is_whole else reference
                reason = None if _agrees(outputs, expected, names, rtol) else f"outputs differ by more than {rtol:g} of the largest"
                if reason and not is_whole and fp32_reference is not None:
                    reason = _as_close_to_fp32(fp32_reference, outputs, reference, names, reason)
        except Exception as exc:  # noqa: BLE001 - a session that fails at run time is not a variant either
            reason = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        if reason:
            wrong.append(f"{label}: {reason}")
            del sides[label]
    if replayed is not None and replayed.winner.impl in subsets:
        best = replayed.winner.impl if replayed.winner.impl in sides else "none"
        medians = {c.config.impl: round(c.median_s * 1e3, 4) for c in replayed.candidates if c.is_ok}
        return _keep(program, marked, subsets, best, (dtypes, ranks, lengths), wrong, medians, 0, cached=True,
                     rtol=(rtol, noise), whole_model=whole_model)
    times = race(sides, feeds, budget_s, clock)
    medians = {label: 1e3 * statistics.median(t) for label, t in times.items()}
    best = min((label for label in medians if label != WHOLE), key=medians.get)
    if medians[best] >= medians["none"] * (1.0 - CONFIRM_MARGIN):
        best = "none"
    if whole_wins(medians):
        best = WHOLE
    if key is not None:
        cache.put(_context_result(key, best, times, wrong))
        cache.save()
    return _keep(program, marked, subsets, best, (dtypes, ranks, lengths), wrong, medians, len(times["none"]), cached=False,
                 rtol=(rtol, noise), whole_model=whole_model)


def race(sides: dict, feeds: dict, budget_s: float, clock=time.perf_counter) -> dict[str, list[float]]:
    """Each variant's run times: rounds of one run of every racing variant, interleaved, for at
    least CONFIRM_MIN_RUNS rounds and then until the budget (`budget_s` per variant, fixed when the
    race starts) is spent or CONFIRM_MAX_RUNS rounds ran. After CONFIRM_MIN_RUNS rounds and
    CONFIRM_DROP_AFTER_S a variant CONFIRM_DROP slower than the fastest stops running, and the time
    it leaves goes to the close ones. (The deadline once shrank with every variant dropped, so a race ended right after its
    first drops: GLPN and wav2vec2 decided between the whole model and a program within 10% of
    it on five runs each.)"""
    times: dict[str, list[float]] = {label: [] for label in sides}
    racing = dict(sides)
    started = clock()
    deadline = started + budget_s * len(sides)
    while len(times["none"]) < CONFIRM_MIN_RUNS or (clock() < deadline and len(times["none"]) < CONFIRM_MAX_RUNS):
        for label, run in racing.items():
            start = clock()
            run.run(feeds)
            times[label].append(clock() - start)
        if len(times["none"]) >= CONFIRM_MIN_RUNS and clock() - started >= CONFIRM_DROP_AFTER_S:
            fastest = min(statistics.median(times[label]) for label in racing)
            racing = {label: run for label, run in racing.items()
                      if label == "none" or statistics.median(times[label]) <= CONFIRM_DROP * fastest}
    return times


def _as_close_to_fp32(fp32_reference: dict, outputs: dict, reference: dict, names: list[str], reason: str) -> str | None:
    """A reduced-precision program's variant that disagrees with it: kept (None) when it is about as
    close to the fp32 model's outputs as the program (tune_whole.closeness_refusal), else why not.
    Quantized activations flip a step where two correct float kernels differ by an ulp, and a deep
    network carries the flips to its outputs: ResNet-50's int8 program with onnxruntime's fp32
    convolutions was more than 1e-2 off infc's, each 0.2 off fp32, and every tactic was refused
    (the program on infc's convolutions 2.6x slower than the fp32 plan)."""
    refusal = closeness_refusal(fp32_reference, outputs, reference, names)
    return None if refusal is None else f"{reason}, and {refusal}"


def _kernel_noise(program: Program, feeds: dict, reference: dict, names: list[str]) -> float:
    """How far two correct evaluations of the unmarked program are apart on these feeds: its outputs
    with the executor's load-time fusions (conv epilogues, fused quantize pairs, folded casts) and
    without them (an observed run takes every step as written), relative to the largest; 0 when
    the program has nothing to fuse. On well-conditioned outputs that is a few float32 ulps; on an
    ill-conditioned one (a classifier fed random normal pixels where it expects 0..255, its logits
    cancelling) it was 1.7e-3, and every onnxruntime variant failed a fixed 1e-4 against it."""
    from .runtime.executor import Executor  # noqa: PLC0415

    try:
        observed = Executor(program.steps, program.weights, program.opset, program.islands, output_names=names,
                            observer=lambda name, value: None, trial=True).run(feeds)
    except Exception:  # noqa: BLE001 - no second opinion: the fixed tolerance stands
        return 0.0
    return relative_distance({name: observed[name] for name in names}, {name: reference[name] for name in names})


def _keep(program: Program, marked: dict, subsets: dict, best: str, inputs: tuple, wrong: list, medians: dict,
          num_runs: int, cached: bool, rtol: tuple = (0.0, 0.0), whole_model: WholeModel | None = None) -> dict:
    """Leaves the program with the `best` subset's marks; the build report's summary (`rtol`: the
    tolerance the variants were checked at and the kernel noise it allowed for)."""
    if best == WHOLE:
        keep_whole(program, whole_model.model_bytes, whole_model.threads)
        return {"num_marked": len(marked), "num_kept": 0, "num_bridges": 0, "kept": best, "rejected_wrong": wrong,
                "cached": cached, "num_sessions": 1, "whole_model": True, "whole_model_threads": whole_model.threads,
                "program_ms": {label: round(ms, 4) for label, ms in medians.items()}, "num_runs": num_runs,
                "agreement_rtol": float(f"{rtol[0]:.3g}"), "kernel_noise": float(f"{rtol[1]:.3g}")}
    program.steps[:] = _with_marks(program.steps, subsets[best], *inputs)  # (dtypes, ranks, lengths) of session inputs
    groups = {step["tactic_group"] for step in program.steps if "tactic_group" in step}
    num_bridges = sum(1 for index in subsets[best] if index not in marked)
    return {"num_marked": len(marked), "num_kept": len(subsets[best]) - num_bridges, "num_bridges": num_bridges,
            "kept": best, "rejected_wrong": wrong, "cached": cached,
            "num_sessions": len(
                [s for s in program.steps if s.get("tactic") and "tactic_group" not in s]) + len(groups),
            "program_ms": {label: round(ms, 4) for label, ms in medians.items()}, "num_runs": num_runs,
            "agreement_rtol": float(f"{rtol[0]:.3g}"), "kernel_noise": float(f"{rtol[1]:.3g}")}


CONTEXT_OP = "program_tactics"  # the timing cache's entry for a program's in-context choice


def context_key(program: Program, feeds: dict, target: str) -> TuningKey:
    """The program's steps with their marks, the feeds' shapes and dtypes, the target and infc's
    source (engine_cache.code_digest, which covers onnxruntime's version): the same key, the same
    programs to choose from."""
    from .engine_cache import code_digest  # noqa: PLC0415

    document = {"steps": _without_provenance(program.steps), "opset": program.opset,
                "feeds": {name: [list(np.shape(value)), np.asarray(value).dtype.str] for name, value in sorted(feeds.items())}}
    digest = hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()[:32]
    return TuningKey(CONTEXT_OP, (("steps", len(program.steps)),), ("float32",), (digest,), "", target, code_digest()[:16])


PROVENANCE = ("source",)  # how a choice was made (a GEMM variant "tuned" or "cached"), not what runs


def _without_provenance(value):
    if isinstance(value, dict):
        return {k: _without_provenance(v) for k, v in value.items() if k not in PROVENANCE}
    if isinstance(value, list):
        return [_without_provenance(v) for v in value]
    return value


def _context_result(key: TuningKey, best: str, times: dict, wrong: list) -> TuneResult:
    candidates = [CandidateResult(Config(label), "ok", statistics.median(t), len(t), min(t)) for label, t in times.items()]
    candidates += [CandidateResult(Config(entry.split(":")[0]), "wrong: " + entry.split(":", 1)[1].strip()[:200]) for entry in wrong]
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return TuneResult(key, Config("none"), Config(best), tuple(candidates), "tuned", date)


def _ratio(step: dict) -> float:
    ratio = step.get("tactic_ratio")
    return math.inf if ratio is None else float(ratio)


AGREE_RTOL = 1e-4  # a program variant's outputs against the unmarked program's, relative to their largest
# ... but never tighter than a few units in the last place of 1.0: a sigmoid near 0 computed one way
# or the other differs by about one (PP-OCR's detector on noise: all its outputs under 3.3e-4, and
# onnxruntime's Sigmoid 1.2e-7 from infc's tanh form)
AGREE_ATOL_FLOOR = 8 * float(np.finfo(np.float32).eps)
# A program that quantizes activations rounds them to a step: a float32 difference of one ulp before
# a rounding boundary flips a value by a whole step, which later layers carry to the outputs (a QDQ
# ResNet-50: about 4e-3 between infc and onnxruntime, as between any two correct float kernels)
AGREE_RTOL_QUANTIZED = 1e-2
# ... and never tighter than this many times the distance between two correct evaluations of the
# unmarked program on the same feeds (_kernel_noise), up to AGREE_RTOL_QUANTIZED: a wrong tactic
# (a padding, a layout) is off by far more than either
NOISE_FACTOR = 4.0
# ... and for a model quantized by another tool, this many times how far onnxruntime's outputs of it
# move when its float inputs move by two ulps (tune_whole.WholeModel.reference_noise), up to this:
# a quantize_dynamic BERT-base-shaped encoder's moved 1-1.8% (and 1.6% between onnxruntime's own
# optimization levels), so every variant was refused at 1e-2; a wrong kernel (a saturating int8
# product, a bad layout) is off by far more
AGREE_RTOL_GRID = 5e-2
QUANTIZING_OPS = INTEGER_STEPS | {"QuantizeLinear", "DynamicQuantizeLinear"}
# fp16 / bf16 plans round every value to the low type between ops (Casts to it): the same flips, one
# low-type step at a time (a VAE decoder in fp16: every onnxruntime convolution tactic was refused at
# 1e-4, and the plan ran 6-10x slower than in fp32 on infc's own kernels)
LOW_FLOAT_TYPES = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}


def agreement_rtol(steps: list[dict]) -> float:
    """How far a program variant's outputs may be from the unmarked program's (relative to the largest)."""
    return AGREE_RTOL_QUANTIZED if any(_steps_to_a_grid(step) for step in steps) else AGREE_RTOL


def _steps_to_a_grid(step: dict) -> bool:
    """A step whose outputs lie on a coarse grid: quantized, or cast to a 16-bit float."""
    if step["op"] in QUANTIZING_OPS:
        return True
    return step["op"] == "Cast" and (step.get("domain") or "") == "" and (step.get("attrs") or {}).get("to") in LOW_FLOAT_TYPES


def _agrees(outputs: dict, reference: dict, names: list[str], rtol: float = AGREE_RTOL) -> bool:
    for name in names:
        got, want = np.asarray(outputs[name]), np.asarray(reference[name])
        if got.shape != want.shape:
            return False
        if want.dtype.kind != "f" or want.size == 0:
            if not np.array_equal(got, want):
                return False
            continue
        scale = max(float(np.nanmax(np.abs(want))) if np.isfinite(want).any() else 0.0, np.finfo(np.float32).tiny)
        if not np.allclose(got, want, rtol=0.0, atol=max(rtol * scale, AGREE_ATOL_FLOOR), equal_nan=True):
            return False
    return True


def _with_marks(steps: list[dict], keep, dtypes: dict | None = None, ranks: dict | None = None,
                lengths: dict | None = None) -> list[dict]:
    """Copies of the steps with the marks of those in `keep` only (a bridge in `keep` gets one; a
    kept step gets `dtypes[index]`, its inputs that are not float32), in an order that keeps the kept
    steps together where their dependencies allow (step_order.py), and each run of consecutive kept
    steps grouped into one session (runtime/vendor_op.py: onnxruntime keeps its blocked layout between
    them). A run that the new order leaves with bridges only stays infc's (with_bridges' rule)."""
    marked, runs = [], []  # runs: [the run's marked copies, whether one was marked before (not a bridge)]
    for index in clustered_order(steps, lambda i: i in keep):
        step = steps[index]
        plain = {k: v for k, v in step.items() if k not in TACTIC_FIELDS}
        if index in keep:
            plain.update({k: step[k] for k in TACTIC_FIELDS if k in step and k != "tactic_group"})
            plain.setdefault("tactic", TACTIC)  # a bridge (tune_bridge.py): never timed alone
            if (dtypes or {}).get(index):  # a session it starts reads these as such
                plain["tactic_dtypes"] = dtypes[index]
            if (ranks or {}).get(index):  # ... and declares them with these ranks
                plain["tactic_ranks"] = ranks[index]
            if (lengths or {}).get(index):  # ... and its shape tensors with their lengths
                plain["tactic_lengths"] = lengths[index]
            previous = marked[-1] if marked else None
            if previous is not None and previous.get("tactic"):
                plain["tactic_group"] = previous.setdefault("tactic_group", index)
                runs[-1][0].append(plain)
                runs[-1][1] |= "tactic" in step
            else:
                runs.append([[plain], "tactic" in step])
        marked.append(plain)
    for members, is_anchored in runs:
        for member in members if not is_anchored else []:
            for field in TACTIC_FIELDS:
                member.pop(field, None)
    return marked
