"""How far a reduced-precision result is from the fp32 reference, per output.

Every error is relative to the output's largest reference magnitude (|a - b| / max|a|), so outputs
with many near-zero elements (probability maps, softmax rows) do not blow up the ratio. Three views:

- `max_rel`: the worst element. Strict, but it also measures how sharply the model amplifies tiny
  perturbations at its decision boundaries: PaddleOCR's detector ends in sigmoid(logits reaching
  ~200), so at the few text-edge pixels where a logit crosses 0 a logit error of 1e-3 of its range
  moves the probability by 0.06. The fp32 model itself, fed its input with 1e-3 relative noise,
  moves those pixels by up to 0.37 (docs/quantization.md).
- `q_rel`: the same ratio at the QUANTILE (99.9th percentile) of elements: the worst element after
  setting aside the 0.1% most sensitive ones. What the self-repair budget (`--tolerance`) is
  measured in by default. A NaN or inf where the reference is finite counts as infinite in every
  view: an overflow is never set aside.
- `mean_rel`: the average element.

For classifier-like outputs (see `is_classifier_like`) also `top1_agreement`: the fraction of rows
(all axes but the last) whose argmax is unchanged. It is reported, not budgeted: a hidden-state
output can look like classes and its argmax means nothing.
"""

from __future__ import annotations

import numpy as np
import onnx

QUANTILE = 0.999
METRICS = ("q_rel", "max_rel")
CLASSIFIER_HEADS = {"Gemm", "MatMul", "FusedGemm", "FusedMatMul", "Softmax", "LogSoftmax"}
_PASS_THROUGH = {"Reshape", "Identity", "Cast", "Flatten", "Squeeze", "Unsqueeze", "Transpose"}


def output_errors(reference: np.ndarray, actual: np.ndarray, is_classifier: bool = False) -> dict:
    a, b = np.asarray(reference, np.float64), np.asarray(actual, np.float64)
    if a.size == 0:
        return {"max_rel": 0.0, "q_rel": 0.0, "mean_rel": 0.0}
    delta = np.abs(a - b)
    delta = np.where(np.isnan(a) & np.isnan(b), 0.0, np.where(np.isnan(delta), np.inf, delta))
    scale = float(np.nanmax(np.abs(np.where(np.isfinite(a), a, 0.0)))) or 1.0
    has_overflow = bool(np.any(~np.isfinite(delta)))
    found = {
        "max_rel": float(delta.max() / scale),
        "q_rel": float("inf") if has_overflow else float(np.quantile(delta, QUANTILE) / scale),
        "mean_rel": float("inf") if has_overflow else float(delta.mean() / scale),
    }
    if is_classifier and a.ndim >= 1 and a.shape[-1] >= 2:
        found["top1_agreement"] = float(np.mean(np.argmax(a, axis=-1) == np.argmax(np.nan_to_num(b), axis=-1)))
    return found


def worst(per_output: list[dict], metric: str) -> float:
    return max((e[metric] for e in per_output), default=0.0)


def is_classifier_like(model: onnx.ModelProto, output: str) -> bool:
    """Rank >= 2, a static last dim >= 2 (classes, vocabulary), produced (through reshapes and casts)
    by a GEMM or a softmax. A probability map has symbolic spatial dims; a hidden state ends in a
    normalization."""
    value = next((o for o in model.graph.output if o.name == output), None)
    dims = value.type.tensor_type.shape.dim if value is not None else []
    if len(dims) < 2 or not dims[-1].HasField("dim_value") or dims[-1].dim_value < 2:
        return False
    producers = {o: n for n in model.graph.node for o in n.output}
    node = producers.get(output)
    while node is not None and node.op_type in _PASS_THROUGH:
        node = producers.get(node.input[0])
    return node is not None and node.op_type in CLASSIFIER_HEADS


def compare_runs(model: onnx.ModelProto, names: list[str], expected: list[list], actual: list[list]) -> list[dict]:
    """Per output over every input set: the worst of each view (top-1 agreement: the mean)."""
    result = []
    for index, name in enumerate(names):
        is_classifier = is_classifier_like(model, name)
        runs = [output_errors(e[index], a[index], is_classifier) for e, a in zip(expected, actual)]
        entry = {"name": name, **{k: max(r[k] for r in runs) for k in ("max_rel", "q_rel", "mean_rel")}}
        if is_classifier:
            entry["top1_agreement"] = float(np.mean([r["top1_agreement"] for r in runs]))
        result.append(entry)
    return result
