"""Numerical verification: the original and the optimized model in onnxruntime on the same inputs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from .errors import BadInput, InfcError
from .feeds import random_feeds
from .ort_env import require_onnxruntime


@dataclass
class OutputDiff:
    name: str
    max_abs_diff: float
    # max |a - b| over max |a|: stable where elementwise ratios blow up near zero
    max_rel_diff: float
    worst_index: tuple

    def to_json(self) -> dict:
        return {"name": self.name, "max_abs_diff": self.max_abs_diff, "max_rel_diff": self.max_rel_diff,
                "worst_index": list(self.worst_index)}


def ort_session(model: onnx.ModelProto, optimize: bool = False):
    ort = require_onnxruntime()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # failures surface as our one-line errors, not as ORT's log lines
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def compare_outputs(names, expected, actual) -> list[OutputDiff]:
    diffs = []
    for name, a, b in zip(names, expected, actual):
        a = np.asarray(a)
        b = np.asarray(b)
        if a.shape != b.shape:
            raise InfcError(f"output '{name}' changed shape: {a.shape} -> {b.shape}")
        if a.size == 0:
            diffs.append(OutputDiff(name, 0.0, 0.0, ()))
            continue
        if a.dtype.kind not in "fc":
            wrong = a != b
            diffs.append(OutputDiff(name, float(wrong.sum()), float(wrong.mean()),
                                    tuple(int(i) for i in np.unravel_index(np.argmax(wrong), a.shape))))
            continue
        delta = np.abs(a.astype(np.float64) - b.astype(np.float64))
        delta = np.where(np.isnan(a) & np.isnan(b), 0.0, delta)
        worst = np.unravel_index(np.nanargmax(np.where(np.isnan(delta), np.inf, delta)), a.shape)
        scale = float(np.nanmax(np.abs(a.astype(np.float64)))) or 1.0
        diffs.append(OutputDiff(name, float(np.nanmax(np.where(np.isnan(delta), np.inf, delta))),
                                float(np.nanmax(np.where(np.isnan(delta), np.inf, delta)) / scale),
                                tuple(int(i) for i in worst)))
    return diffs


def verify_models(original: onnx.ModelProto, optimized: onnx.ModelProto, seed: int = 0,
                  feeds: dict | None = None, dims: dict | None = None) -> list[OutputDiff]:
    feeds = feeds if feeds is not None else random_feeds(original, seed, dims)
    names = [o.name for o in original.graph.output]
    try:
        expected = ort_session(original).run(names, feeds)
    except Exception as exc:  # noqa: BLE001 - report ORT's reason in one line
        raise BadInput(f"onnxruntime cannot run the original model on generated inputs "
                        f"({str(exc).splitlines()[0][:200]}); give inputs with --inputs or dims with --dim") from None
    try:
        actual = ort_session(optimized).run(names, feeds)
    except Exception as exc:  # noqa: BLE001
        raise InfcError(f"onnxruntime cannot run the optimized model: {str(exc).splitlines()[0][:300]}") from None
    return compare_outputs(names, expected, actual)
