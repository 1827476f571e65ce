"""The whole model in one onnxruntime session, as one more variant of the in-context check.

onnxruntime always competes (GUIDE.md): per GEMM shape, per convolution, per run of steps
(tune_vendor.py, tune_context.py). On a small model that is not enough: each of infc's steps costs
a few microseconds of Python, and a tree ensemble or a tiny audio net is hundreds of steps of a few
microseconds of work, between islands that split any run of sessions (an IsolationForest: 761 steps
around two islands, 6.9x onnxruntime's time). So the model that was lowered (optimized, at the
build's precision) also runs as one island, timed and checked with the other variants; it is kept
only when it beats the fastest of them by WHOLE_MARGIN, and then it is the whole program: one
island step over the model, whose section holds the weights (the program's own go). At fp32 the
model as given is its other form: prove() times both in onnxruntime once, side by side, each also
at one intra-op thread, and the variant is the faster (AS_GIVEN_MARGIN), since infc's fusions,
written for its kernels, can make onnxruntime slower on a small model than its own fusions of the
original.

What it must agree with: at fp32, onnxruntime's outputs of the model as given, in a session with
its graph optimizations on (what a user of onnxruntime gets), not infc's program. The two differ on
models quantized by other tools: the program computes the QDQ model's float arithmetic (bit for bit
onnxruntime with its graph optimizations off, the reference of infc's other checks), onnxruntime's
fused int8 kernels sum in integers, and a value near a bin edge flips a step (a QDQ ResNet: 2-3% of
the largest output between them, each as far from fp32). In a reduced-precision build the model is
infc's own (fp16 with fp32 islands, QDQ int8, where onnxruntime's int8 kernels are the speed that
`--precision int8` is for on a CPU): there it must be about as close to the fp32 model's outputs as
infc's program is (ACCURACY_FACTOR, ACCURACY_SLACK), since the two round differently.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np
import onnx

from .child_run import CHILD_TIMEOUT_S, run_in_child
from .lower import ISLAND_OP, Program
from .runtime.conv_sum_form import with_conv_sums_unfused

WHOLE = "onnxruntime-whole-model"  # the variant's label in the check and the timing cache
WHOLE_KEEP = frozenset({-1})  # its stand-in for a set of marked steps
WHOLE_SECTION = "island_whole_model"  # plan sections named island* are islands (runtime/session.py)
# infc's own kernels stay unless the whole model in onnxruntime is this much faster: a tie within the
# race's noise keeps them, a real lead does not. The whole model is onnxruntime itself, so this is how
# much slower than onnxruntime a plan may be kept; at 10% RegNetY-800MF (batch 2) kept an all-tactic
# program 9% slower than the whole model (39.7 against 36.2 ms in the race), against the promise
WHOLE_MARGIN = 0.02
# Above this the model is not offered whole: while the variants race it is held three more times
# (its bytes, the session, the reference's session), and protobuf cannot serialize past 2 GiB.
WHOLE_MAX_BYTES = 1 << 30


ACCURACY_FACTOR = 2.5  # reduced precision: its error from fp32 at most this times infc's program's ...
ACCURACY_SLACK = 1e-3  # ... or at most this more (of the largest output), whichever is looser: on the
# check's one input the two int8 roundings land 1-3% from fp32 either way; a mis-fused int8 kernel (a
# saturating u8 x s8 product without VNNI: 6%, quantization.md) is what this refuses


@dataclass
class WholeModel:
    model_bytes: bytes
    is_reduced: bool = False  # a reduced-precision model (compared by accuracy, not agreement)
    # onnxruntime's outputs of the model as given (the fp32 model), on the check's feeds; None: the
    # variant is checked against infc's program
    reference: dict[str, np.ndarray] | None = None
    # how far those outputs move when the float inputs move by an ulp, relative to the largest: a
    # model quantized by another tool rounds its activations to a grid, and a value near a bin edge
    # flips a step, so two correct evaluations of it are this far apart (0: not measured)
    reference_noise: float = 0.0
    # fp32: the model as given, timed against the optimized one in prove() (AS_GIVEN_MARGIN); None once
    # decided, or where not offered
    as_given_bytes: bytes | None = None
    form: str = "optimized"  # which of the two `model_bytes` is: "optimized" or "as given"
    form_ms: dict = field(default_factory=dict)  # prove()'s medians of the forms, where it timed them
    # its session's intra-op threads: None, onnxruntime's default (a thread per core); 1 where prove()
    # timed one thread faster (picked_form)
    threads: int | None = None


# The whole model is the optimized model, unless onnxruntime runs the model as given faster by this
# much. infc's fusions are written for its own kernels; onnxruntime fuses the original its own way,
# and on tiny models its unfused path beats the ops infc fused (BERT fixture at 2x16 tokens: 93 us
# as given, 170 us optimized; without infc's attention fusion 133 us, without its GEMM fusion 129 us).
# Each form also runs in a session of one intra-op thread, kept by the same margin: on a small model
# the pool's wake-ups and spin-waits cost more than the work they split, and on a shared machine a
# spinning worker waits for a core another process holds (AECMOS's GRU model, two cores, one busy:
# 60 ms optimized in onnxruntime's default session, 30 ms as given at one thread). The one-thread
# forms are timed only where a second session of the model is cheap to hold (AS_GIVEN_MAX_BYTES).
AS_GIVEN_MARGIN = 0.05
AS_GIVEN_MAX_BYTES = 1 << 28  # a second copy of the model is held until prove() picks: small models only
FORM_BUDGET_S = 0.4  # prove()'s timing of the forms, all together
ONE_THREAD = ", 1 thread"  # the suffix of a form's label timed at one thread
FORM_ORDER = ("optimized", "as given", "optimized" + ONE_THREAD, "as given" + ONE_THREAD)  # the preferred first


def offer(model: onnx.ModelProto | None, is_reduced: bool = False,
          as_given: onnx.ModelProto | None = None) -> WholeModel | None:
    """The whole-model variant over `model` (the optimized model at fp32); `as_given`, at fp32, the
    model before infc's passes, raced against it once in prove() when its inputs and outputs are the same."""
    model_bytes = whole_model_bytes(model)
    if model_bytes is None:
        return None
    whole = WholeModel(model_bytes, is_reduced)
    if as_given is not None and not is_reduced and as_given.ByteSize() <= AS_GIVEN_MAX_BYTES and _same_io(model, as_given):
        whole.as_given_bytes = whole_model_bytes(as_given)
    return whole


def _same_io(a: onnx.ModelProto, b: onnx.ModelProto) -> bool:
    def io(model):
        initializers = {init.name for init in model.graph.initializer}
        return ([i.name for i in model.graph.input if i.name not in initializers], [o.name for o in model.graph.output])
    return io(a) == io(b)


def accuracy_refusal(whole: WholeModel, outputs: dict, program_outputs: dict, names: list[str]) -> str | None:
    """Reduced precision: why the whole model's outputs are not about as close to fp32 as infc's
    program's; None when they are."""
    return closeness_refusal(whole.reference, outputs, program_outputs, names)


def closeness_refusal(fp32_outputs: dict, outputs: dict, program_outputs: dict, names: list[str]) -> str | None:
    """Why `outputs` are not about as close to `fp32_outputs` as infc's program's (ACCURACY_FACTOR,
    ACCURACY_SLACK); None when they are. Also the check of tactic variants of a reduced-precision
    program (tune_context.py), which round otherwise than the program does."""
    def error(got: dict) -> float:
        worst = 0.0
        for name in names:
            want = np.asarray(fp32_outputs[name], np.float64)
            if want.dtype.kind != "f" or want.size == 0:
                continue
            scale = max(float(np.abs(want).max()), np.finfo(np.float32).tiny)
            worst = max(worst, float(np.abs(np.asarray(got[name], np.float64) - want).max()) / scale)
        return worst

    ours, theirs = error(program_outputs), error(outputs)
    if theirs <= max(ACCURACY_FACTOR * ours, ours + ACCURACY_SLACK):
        return None
    return f"{theirs:.3g} of the largest output from fp32, where infc's program is {ours:.3g}"


def prove(whole: WholeModel, original: onnx.ModelProto | None, feeds: dict, timeout_s: float = CHILD_TIMEOUT_S) -> str | None:
    """Runs the whole model once on `feeds` in a forked child (child_run.py), and there computes
    onnxruntime's outputs of the `original` (fp32) model into `whole.reference`: a session that
    kills the process then costs the variant, not the build. None when it ran; else why it is not
    raced."""
    def once():  # one dict of arrays back from the child: the nudged outputs under NUDGED-prefixed names
        _run_once(whole.model_bytes, feeds)
        reference = original_outputs(original, feeds) if original is not None else None
        if reference is not None and _on_a_grid(original):
            reference.update({NUDGED + name: value for name, value in (original_outputs(original, nudged_feeds(feeds)) or {}).items()})
        forms = _forms(whole)
        if forms:  # last: the reference already ran the model as given here
            timed = time_forms(forms, feeds)
            reference = {**(reference or {}), **{FORM_MS + form: np.float64(ms) for form, ms in timed.items()}}
        return reference

    outputs, failure = run_in_child(once, timeout_s)
    as_given, whole.as_given_bytes = whole.as_given_bytes, None
    if failure is not None:
        return failure + " running it on the build's inputs"
    if outputs is not None:
        whole.form_ms = {name[len(FORM_MS):]: float(value) for name, value in outputs.items() if name.startswith(FORM_MS)}
        outputs = {name: value for name, value in outputs.items() if not name.startswith(FORM_MS)} or None
        picked = picked_form(whole.form_ms)
        whole.form = picked.removesuffix(ONE_THREAD)
        whole.threads = 1 if picked.endswith(ONE_THREAD) else None
        if whole.form == "as given":
            whole.model_bytes = as_given
    if outputs is not None:
        nudged = {name[len(NUDGED):]: value for name, value in outputs.items() if name.startswith(NUDGED)}
        whole.reference = {name: value for name, value in outputs.items() if not name.startswith(NUDGED)}
        whole.reference_noise = relative_distance(nudged, whole.reference) if nudged else 0.0
    return None


NUDGED = "infc-nudged/"
FORM_MS = "infc-form-ms/"


def picked_form(form_ms: dict[str, float]) -> str:
    """The label prove() keeps: in the order timed (the optimized model first, onnxruntime's default
    threads before one), a form replaces the one kept when it is faster by AS_GIVEN_MARGIN."""
    picked = "optimized"
    for label in FORM_ORDER:
        if form_ms.get(label, np.inf) < form_ms.get(picked, np.inf) * (1.0 - AS_GIVEN_MARGIN):
            picked = label
    return picked


def _forms(whole: WholeModel) -> dict[str, tuple[bytes, int | None]]:
    """What prove() times: the optimized model and, at fp32, the model as given, each at onnxruntime's
    default threads and at one thread (by label: bytes, threads); nothing where neither race applies."""
    forms = {"optimized": (whole.model_bytes, None)}
    if whole.as_given_bytes is not None:
        forms["as given"] = (whole.as_given_bytes, None)
    if (os.cpu_count() or 1) > 1 and len(whole.model_bytes) <= AS_GIVEN_MAX_BYTES:
        forms.update({form + ONE_THREAD: (model_bytes, 1) for form, (model_bytes, _) in list(forms.items())})
    return forms if len(forms) > 1 else {}


def time_forms(forms: dict[str, tuple[bytes, int | None]], feeds: dict, budget_s: float = FORM_BUDGET_S) -> dict[str, float]:
    """Median ms of a run of each model (label: bytes, intra-op threads) in onnxruntime (as an island
    runs it: spinning, the known crashes' optimizers off), in interleaved rounds that share the machine's noise."""
    runs = {form: _session_run(model_bytes, feeds, threads) for form, (model_bytes, threads) in forms.items()}
    for run in runs.values():
        run()  # the first run allocates
    samples: dict[str, list[float]] = {form: [] for form in runs}
    deadline = time.perf_counter() + budget_s
    for _ in range(FORM_ROUNDS):
        for form, run in runs.items():
            for _ in range(FORM_RUNS_A_ROUND):
                started = time.perf_counter()
                run()
                samples[form].append(time.perf_counter() - started)
        if time.perf_counter() > deadline:
            break
    return {form: float(np.median(times)) * 1e3 for form, times in samples.items()}


FORM_ROUNDS, FORM_RUNS_A_ROUND = 5, 10


GRID_OPS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "QLinearMatMul",
                      "QLinearConv", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"})


def _on_a_grid(model: onnx.ModelProto) -> bool:
    """The model quantizes activations (a tool's QDQ or QOperator model, quantize_dynamic)."""
    return any(node.op_type in GRID_OPS for node in model.graph.node)


def nudged_feeds(feeds: dict) -> dict:
    """The feeds with every float value moved by about two ulps, up or down at random (seeded): what
    two correct kernels computing the same value may differ by. (Scaling a whole tensor would not
    do: a quantizer whose scale follows the tensor's range maps it to the same codes.)"""
    rng = np.random.default_rng(0)
    nudged = {}
    for name, value in feeds.items():
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            signs = rng.choice(np.array([-1.0, 1.0]), value.shape)
            value = (value * (1.0 + signs * 2.0 ** -22)).astype(value.dtype)
        nudged[name] = value
    return nudged


def relative_distance(got: dict, want: dict) -> float:
    """The largest difference of the float outputs both have, relative to each output's largest value."""
    worst = 0.0
    for name, expected in want.items():
        expected = np.asarray(expected)
        value = np.asarray(got.get(name))
        if expected.dtype.kind != "f" or value.shape != expected.shape or not expected.size or not np.isfinite(expected).all():
            continue
        scale = float(np.abs(expected).max())
        if scale > 0:
            worst = max(worst, float(np.abs(value.astype(np.float64) - expected).max()) / scale)
    return worst


def _run_once(model_bytes: bytes, feeds: dict) -> None:
    _session_run(model_bytes, feeds)()


def _session_run(model_bytes: bytes, feeds: dict, threads: int | None = None):
    """A call that runs the model once in a fresh session (of `threads` intra-op threads; None: the
    default) on the feeds it reads."""
    import onnxruntime as ort  # noqa: PLC0415

    from .runtime.ort_crashes import optimizers_to_disable  # noqa: PLC0415
    from .runtime.vendor_op import as_feed  # noqa: PLC0415

    options = ort.SessionOptions()
    options.log_severity_level = 4
    if threads:
        options.intra_op_num_threads = int(threads)
    session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"],
                                   disabled_optimizers=optimizers_to_disable(onnx.load_from_string(model_bytes).graph.node) or None)
    names = {i.name for i in session.get_inputs()}
    fed = {name: as_feed(value) for name, value in feeds.items() if name in names}
    return lambda: session.run(None, fed)


def original_outputs(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray] | None:
    """onnxruntime's outputs of the model as given (graph optimizations on), or None when it does not run it."""
    from .verify import ort_session  # noqa: PLC0415

    names = [o.name for o in model.graph.output]
    try:
        return dict(zip(names, ort_session(model, optimize=True).run(names, feeds)))
    except Exception:  # noqa: BLE001 - the variant is then checked against infc's program
        return None


def whole_model_offered() -> bool:
    """False under INFC_WHOLE_MODEL=0: infc's kernels only, bar their own tactics (the test suite sets it)."""
    return os.environ.get("INFC_WHOLE_MODEL", "1") != "0"


def whole_model_bytes(model: onnx.ModelProto | None) -> bytes | None:
    """The lowered model as one island's bytes, or None when it is too large to offer or not offered."""
    if model is None or not whole_model_offered() or model.ByteSize() > WHOLE_MAX_BYTES:
        return None
    if any(not value.type.HasField("tensor_type") for value in [*model.graph.input, *model.graph.output]):
        return None  # plans hold tensors (sequences and maps are refused elsewhere)
    return with_conv_sums_unfused(model).SerializeToString()  # onnxruntime's NCHWc form (conv_sum_form.py)


def whole_step(program: Program, threads: int | None = None) -> dict:
    """The one step of the whole-model variant: the program's inputs in, its outputs out; `threads`:
    its session's intra-op threads (WholeModel.threads)."""
    return {"op": ISLAND_OP, "domain": "", "name": WHOLE, "section": WHOLE_SECTION, "ops": ["(the whole model)"],
            "inputs": [i["name"] for i in program.inputs], "outputs": [o["name"] for o in program.outputs], "attrs": {},
            **({"tactic_threads": int(threads)} if threads else {})}


def keep_whole(program: Program, model_bytes: bytes, threads: int | None = None) -> None:
    """Makes the program the whole-model variant (its steps, islands and weights)."""
    program.steps[:] = [whole_step(program, threads)]
    program.islands = {WHOLE_SECTION: model_bytes}
    program.weights.clear()


def wins(medians: dict[str, float]) -> bool:
    """The whole model beats every other variant by WHOLE_MARGIN."""
    others = [ms for label, ms in medians.items() if label != WHOLE]
    return WHOLE in medians and bool(others) and medians[WHOLE] < min(others) * (1.0 - WHOLE_MARGIN)
