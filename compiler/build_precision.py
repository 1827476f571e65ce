"""The precision step of `infc build` for one-shot plans, between the optimizer and lowering:

    optimized fp32 ONNX ── apply_precision ──► fp16/bf16 (fp32 islands, self-repair) or int8 QDQ
                       ── fold_constant_casts ──► weights constant again ──► lower ──► program
    program ── run on the verification inputs, against the fp32 original in onnxruntime ──► accuracy

fp16/bf16 are converted for infc's CPU runtime (`kernels="infc-cpu"`, fp32_ops.py): values are
stored in the low type between ops and every arithmetic op computes in fp32 from low-rounded inputs
and weights. The repair (default tolerance 1e-2, `q_rel`, see quantize/accuracy.py) always runs.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field

import onnx

from .errors import BadInput
from .feeds import random_feeds
from .quantize import apply_precision
from .quantize.api import NUM_REPAIR_SAMPLES
from .quantize.accuracy import compare_runs, worst
from .quantize.calib_data import calibration_files, iter_calibration
from .quantize.weight_range import CHOICES, weight_limit
from .quantize.fold_casts import fold_constant_casts
from .runtime.executor import Executor
from .verify import ort_session

DEFAULT_TOLERANCE = 1e-2
ONE_SHOT_PRECISIONS = ("fp32", "fp16", "bf16", "int8")
# What a CPU plan of each precision computes, for `infc inspect`.
COMPUTE = {
    "fp16": "values stored in fp16 between ops (data movement runs in fp16); every arithmetic op computes in fp32 "
            "from fp16-rounded inputs and weights and rounds its result to fp16 (NumPy has no fast fp16 GEMM); "
            "weights of those ops are stored as fp32 holding the fp16-rounded values",
    "bf16": "values stored in bf16 (ml_dtypes) between ops; every op computes in fp32 from bf16-rounded inputs and "
            "weights and rounds its result to bf16 (NumPy has no bf16 arithmetic); weights are stored as fp32 "
            "holding the bf16-rounded values",
    "int8": "computes in fp32 from dequantized weights: int8 per-channel weights are stored dequantized "
            "(int8 x scale, as fp32); activations are fake-quantized by QuantizeLinear/DequantizeLinear steps",
}


@dataclass
class PrecisionSettings:
    tolerance: float | None = None  # None: DEFAULT_TOLERANCE for fp16/bf16
    calib: str | None = None
    calib_method: str = "minmax"
    int8_weights: str = "auto"  # quantize/weight_range.py CHOICES
    lm_head: str = "auto"  # decoder plans' LM head: LM_HEAD_CHOICES (decoder/lm_head.py)

    def key_options(self, precision: str) -> dict:
        """What changes the plan besides the precision (engine-cache key); empty for fp32."""
        if precision == "fp32":
            return {}
        key = {"tolerance": self.tolerance, "calib_method": self.calib_method if precision == "int8" else None}
        if precision == "int8":  # auto resolved on this CPU: the limit is what changes the plan
            key["int8_weight_limit"] = weight_limit(CHOICES[self.int8_weights])
        if self.calib:
            digest = hashlib.sha256()
            for path in calibration_files(self.calib):
                digest.update(path.name.encode() + path.read_bytes())
            key["calib_sha256"] = digest.hexdigest()
        return key


@dataclass
class PrecisionStep:
    precision: str
    model: onnx.ModelProto  # what gets lowered
    original: onnx.ModelProto | None = None  # the fp32 model as given: the accuracy reference
    feeds_list: list = field(default_factory=list)
    report: dict = field(default_factory=dict)
    # what onnxruntime runs as the whole-model variant (tune_whole.py): the converted model before its
    # constant DequantizeLinears and Casts were folded. A QDQ model whose weights were dequantized to
    # fp32 constants runs in onnxruntime as fp32 Convs with fake-quantized activations, not as its
    # int8 kernels (QLinearConv / QGemm need the DequantizeLinear on the weight): ResNet-50's int8
    # plan took 200 ms where onnxruntime ran the unfolded model in 108.
    vendor_model: onnx.ModelProto | None = None

    def finish(self, program, log=lambda msg: None) -> dict | None:
        """The plan metadata's `precision` entry (None for fp32): what was converted, pinned, and the
        accuracy of the lowered program itself against the fp32 original. The repair measured the
        converted ONNX model in onnxruntime; the plan's kernels round differently, so the plan's own
        error is checked against the budget again and a miss is said, not hidden."""
        if self.precision == "fp32":
            return None
        names = [o["name"] for o in program.outputs]
        executor = Executor(program.steps, program.weights, program.opset, program.islands, output_names=names)
        reference = ort_session(self.original)
        expected = [reference.run(names, feeds) for feeds in self.feeds_list]
        actual = [[executor.run(feeds)[n] for n in names] for feeds in self.feeds_list]
        outputs = compare_runs(self.original, names, expected, actual)
        self.report["accuracy"] = {"reference": "the fp32 model in onnxruntime", "num_inputs": len(self.feeds_list),
                                   "outputs": outputs}
        repair = self.report.get("repair")
        if repair:
            error = worst(outputs, repair["metric"])
            self.report["accuracy"]["within_tolerance"] = error <= repair["tolerance"]
            if error > repair["tolerance"]:
                log(f"warning: the {self.precision} plan's {repair['metric']} error {error:.3g} exceeds the tolerance "
                    f"{repair['tolerance']:g} (the repair measured {repair['error_after']:.3g} in onnxruntime)")
        return self.report


def reduce_precision(original: onnx.ModelProto, optimized: onnx.ModelProto, profile, precision: str,
                     settings: PrecisionSettings, log=lambda msg: None) -> PrecisionStep:
    if precision == "fp32":
        if any(node.op_type == "DequantizeLinear" for node in optimized.graph.node):  # a QDQ model's int8 weights
            optimized = fold_constant_casts(optimized, ops={"DequantizeLinear"})[0]  # dequantized once (fold_casts.py)
        return PrecisionStep(precision, optimized)
    if precision not in ONE_SHOT_PRECISIONS:
        raise BadInput(f"--precision {precision}: one-shot plans take {', '.join(ONE_SHOT_PRECISIONS)} "
                       "(w8 is for decoder plans: a profile with a 'decode:' block)")
    if settings.calib:
        feeds_list = list(itertools.islice(iter_calibration(settings.calib, optimized), NUM_REPAIR_SAMPLES))
    else:
        feeds_list = [profile_feeds(optimized, profile.shapes("opt"), seed) for seed in range(NUM_REPAIR_SAMPLES)]
    tolerance = settings.tolerance if settings.tolerance is not None else DEFAULT_TOLERANCE
    log(f"precision {precision}: converting" + (" and repairing" if precision != "int8" else ""))
    model, report = apply_precision(optimized, precision, tolerance=tolerance if precision != "int8" else None,
                                    calib=settings.calib, method=settings.calib_method, kernels="infc-cpu",
                                    feeds_list=feeds_list, int8_weights=settings.int8_weights)
    converted = model
    model, folded = fold_constant_casts(model)
    summary = {"precision": precision, "compute": COMPUTE[precision], "folded_constants": folded,
               **_summarize(report)}
    for note in _notes(summary):  # e.g. a float16 model that --precision int8 / bf16 left as it was
        log(f"warning: precision {precision}: {note}")
    return PrecisionStep(precision, model, original, feeds_list, summary, vendor_model=converted)


def _notes(summary: dict) -> list[str]:
    return list((summary.get("int8") or {}).get("notes", ())) + list((summary.get("conversion") or {}).get("notes", ()))


def profile_feeds(model: onnx.ModelProto, shapes: dict, seed: int) -> dict:
    """Seeded random inputs at the profile's shapes: each symbolic dim takes the profile's value."""
    dims = {}
    for value in model.graph.input:
        for dim, size in zip(value.type.tensor_type.shape.dim, shapes.get(value.name, ())):
            if dim.dim_param:
                dims[dim.dim_param] = int(size)
    return random_feeds(model, seed, dims)


def _summarize(report: dict) -> dict:
    """The plan keeps counts and the repair's pins, not the per-node lists (`infc optimize --json` has them)."""
    if "int8" in report:
        int8 = report["int8"]
        return {"int8": {k: int8[k] for k in ("method", "activation_type", "weight_type", "num_samples", "quantized",
                                               "skipped", "num_activations", "notes") if k in int8}}
    conversion = report["conversion"]
    reasons: dict[str, int] = {}
    for _, _, reason in conversion["fp32_nodes"]:
        reasons[reason] = reasons.get(reason, 0) + 1
    result = {"conversion": {"num_nodes": conversion["num_nodes"], "num_low": conversion["num_low"],
                             "num_emulated": conversion["num_emulated"], "num_casts": conversion["num_casts"],
                             "fp32_by_reason": reasons, "notes": conversion["notes"]}}
    if "repair" in report:
        result["repair"] = report["repair"]
    return result
