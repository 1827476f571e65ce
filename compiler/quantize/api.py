"""The one call the CLI makes for `--precision fp16|bf16|int8 [--tolerance T] [--calib DATA]`."""

from __future__ import annotations

import itertools

import onnx

from ..errors import BadInput
from ..feeds import random_feeds
from .calib_data import iter_calibration
from .int8 import quantize_int8
from .precision import convert_precision
from .repair import repair_precision
from .weight_range import CHOICES

PRECISIONS = ("fp16", "bf16", "int8")
# Inputs the repair compares on: the first few calibration samples, else seeded random inputs.
NUM_REPAIR_SAMPLES = 3


def apply_precision(model: onnx.ModelProto, precision: str, tolerance: float | None = None, calib: str | None = None,
                    method: str = "minmax", seed: int = 0, dims: dict | None = None, kernels: str = "onnxruntime",
                    feeds_list: list[dict] | None = None, metric: str = "q_rel",
                    int8_weights: str = "auto") -> tuple[onnx.ModelProto, dict]:
    """`model`: fp32 ONNX (typically optimize_model's output). fp16/bf16: convert for the runtime
    `kernels` (fp32_ops.KERNEL_SETS), then, with a `tolerance`, run fp32 and the result in onnxruntime
    and pin nodes to fp32 until the output error (`metric`, accuracy.py) is within it; the inputs are
    `feeds_list`, else the first calibration samples, else seeded random ones. int8: QDQ calibrated on
    `calib` (an .npz or a folder of them) with `method`, weight codes per `int8_weights` (auto, 8bit,
    7bit: weight_range.py). Returns the model and a JSON-ready report."""
    if precision not in PRECISIONS:
        raise BadInput(f"--precision {precision}: expected one of {', '.join(PRECISIONS)}")
    if precision == "int8":
        if calib is None:
            raise BadInput("--precision int8 needs calibration data: --calib FILE.npz or a folder of .npz files")
        if int8_weights not in CHOICES:
            raise BadInput(f"--int8-weights {int8_weights}: expected one of {', '.join(CHOICES)}")
        quantized, report = quantize_int8(model, iter_calibration(calib, model), method,
                                          reduce_range=CHOICES[int8_weights])
        return quantized, {"precision": precision, "int8": report.to_json()}
    converted, report = convert_precision(model, precision, kernels=kernels)
    result = {"precision": precision, "conversion": report.to_json()}
    if tolerance is None:
        return converted, result
    if feeds_list is None and calib is not None:
        feeds_list = list(itertools.islice(iter_calibration(calib, model), NUM_REPAIR_SAMPLES))
    if feeds_list is None:
        feeds_list = [random_feeds(model, seed + k, dims) for k in range(NUM_REPAIR_SAMPLES)]
    repaired, repair = repair_precision(model, converted, tolerance, feeds_list, metric=metric)
    result["repair"] = repair.to_json()
    return repaired, result
