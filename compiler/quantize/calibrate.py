"""Activation ranges from calibration data: the model runs in onnxruntime with the wanted
intermediate values added as graph outputs, one sample at a time; each value feeds a streaming
observer and is dropped, so memory is one sample's activations plus fixed-size statistics."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx

from ..errors import BadInput, InfcError
from ..ort_env import require_onnxruntime
from .observers import NUM_BINS, Histogram, MinMax

METHODS = ("minmax", "percentile", "entropy")
DEFAULT_PERCENTILE = 99.999


def _session_with_outputs(model: onnx.ModelProto, names: list[str]):
    ort = require_onnxruntime()
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    existing = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in existing)
    options = ort.SessionOptions()
    # Basic rewrites keep every value we asked for and its fp32 numerics; layout rewrites are off.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3
    return ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])


def collect_ranges(model: onnx.ModelProto, names: list[str], feeds: Iterable[dict[str, np.ndarray]],
                   method: str = "minmax", percentile: float = DEFAULT_PERCENTILE,
                   num_bins: int = NUM_BINS) -> tuple[dict[str, tuple[float, float]], int]:
    """(value name -> (lo, hi), number of samples seen)."""
    if method not in METHODS:
        raise BadInput(f"calibration method '{method}': expected one of {', '.join(METHODS)}")
    session = _session_with_outputs(model, names)
    observers = {n: (MinMax() if method == "minmax" else Histogram(num_bins)) for n in names}
    num_samples = 0
    for sample in feeds:
        try:
            values = session.run(names, sample)
        except Exception as exc:  # noqa: BLE001 - one line naming the sample
            raise InfcError(f"calibration sample {num_samples}: onnxruntime cannot run it: "
                            f"{str(exc).splitlines()[0][:200]}") from None
        for name, value in zip(names, values):
            observers[name].update(value)
        del values
        num_samples += 1
    if num_samples == 0:
        raise BadInput("no calibration samples")
    if method == "minmax":
        return {n: o.range() for n, o in observers.items()}, num_samples
    if method == "percentile":
        return {n: o.percentile_range(percentile) for n, o in observers.items()}, num_samples
    return {n: o.entropy_range() for n, o in observers.items()}, num_samples
