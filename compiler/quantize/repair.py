"""Self-repair of an fp16/bf16 model: find the nodes whose reduced precision breaks the error budget
and pin them to fp32.

The fp32 original and candidate conversions run in onnxruntime on the same inputs; the error is the
largest `metric` (accuracy.py: `q_rel` by default, |a - b| / max |a| at the 99.9th percentile of
elements, or `max_rel`, the worst element; NaN or inf counts as infinite in both) over outputs and
inputs. The search first finds the shortest tail of the converted nodes (topological
order) whose pinning is enough, then bisects inside it in topological halves (delta debugging): if
pinning one half is enough, recurse into it; otherwise both halves hold culprits, and each is
minimized with the other one pinned. A few culprits among N nodes cost O(k log N) conversions.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

import onnx

from ..errors import BadInput
from ..verify import ort_session
from .accuracy import METRICS, output_errors
from .model_parts import get_metadata
from .precision import METADATA_KEY, Prepared, convert_precision

# Each trial converts and runs the model on every input; these bound the search's time. The count alone
# let a large, sensitive model (a 768-channel ConvMixer at 224x224, 15 s a trial) search for 10 minutes.
MAX_CONVERSIONS = 40
MAX_SECONDS = 120.0


@dataclass
class RepairReport:
    tolerance: float
    error_before: float
    error_after: float
    is_within_tolerance: bool
    pinned: list = field(default_factory=list)  # [node, op] pinned to fp32 by the repair
    num_conversions: int = 0
    metric: str = "q_rel"  # what error_before / error_after measure (accuracy.py)
    # False when the search budget ran out and whole chunks were pinned instead of single nodes
    is_minimal: bool = True

    def to_json(self) -> dict:
        return asdict(self)


class _Trials:
    """Converts with a set of pinned nodes and measures the error; every result is cached."""

    def __init__(self, original: onnx.ModelProto, settings: dict, feeds_list: list[dict], budget: int, metric: str,
                 max_seconds: float = MAX_SECONDS):
        self.budget, self.metric = budget, metric
        self.deadline = time.monotonic() + max_seconds
        self.is_minimal = True
        self.prepared = Prepared.of(original, settings["precision"])
        self.settings = settings
        self.base_pins = frozenset(settings.pop("pinned", ()))
        self.feeds_list = feeds_list
        self.names = [o.name for o in original.graph.output]
        reference = ort_session(self.prepared.model)
        self.expected = [reference.run(self.names, feeds) for feeds in feeds_list]
        self._errors: dict[frozenset, float] = {}

    def convert(self, pins) -> tuple[onnx.ModelProto, object]:
        return convert_precision(self.prepared, pinned=self.base_pins | frozenset(pins), **self.settings)

    def error(self, pins) -> float:
        key = frozenset(pins)
        if key not in self._errors:
            model, _ = self.convert(key)
            self._errors[key] = error_of(model, self.names, self.feeds_list, self.expected, self.metric)
        return self._errors[key]

    @property
    def num_conversions(self) -> int:
        return len(self._errors)

    @property
    def is_spent(self) -> bool:
        return self.num_conversions >= self.budget or time.monotonic() >= self.deadline


def error_of(model: onnx.ModelProto, names, feeds_list, expected, metric: str = "q_rel") -> float:
    session = ort_session(model)
    worst = 0.0
    for feeds, reference in zip(feeds_list, expected):
        errors = [output_errors(a, b)[metric] for a, b in zip(reference, session.run(names, feeds))]
        worst = max([worst] + errors)
    return worst


def repair_precision(original_fp32: onnx.ModelProto, converted: onnx.ModelProto, tolerance: float,
                     feeds_list: list[dict], max_conversions: int = MAX_CONVERSIONS,
                     metric: str = "q_rel", max_seconds: float = MAX_SECONDS) -> tuple[onnx.ModelProto, RepairReport]:
    """`converted` must come from `convert_precision(original_fp32, ...)` (its settings are read from
    the model's metadata). Returns the repaired model (or `converted` when it is within tolerance).
    After `max_conversions` trials or `max_seconds` the search stops splitting and pins the chunks it
    still holds (the report says is_minimal False)."""
    if metric not in METRICS:
        raise BadInput(f"error metric '{metric}': expected one of {', '.join(METRICS)}")
    settings = get_metadata(converted, METADATA_KEY)
    if settings is None:
        raise BadInput(f"the model to repair has no '{METADATA_KEY}' metadata: convert it with convert_precision first")
    trials = _Trials(original_fp32, json.loads(settings), feeds_list, max_conversions, metric, max_seconds)
    _, report = trials.convert(())
    before = trials.error(())
    if before <= tolerance:
        return converted, RepairReport(tolerance, before, before, True, [], trials.num_conversions, metric)
    candidates = list(report.low_nodes)
    if trials.error(candidates) > tolerance:
        model, _ = trials.convert(candidates)
        return model, RepairReport(tolerance, before, trials.error(candidates), False,
                                   _with_ops(trials, candidates), trials.num_conversions, metric)
    pins = _minimize(trials, _shortest_suffix(trials, candidates, tolerance), frozenset(), tolerance)
    model, _ = trials.convert(pins)
    return model, RepairReport(tolerance, before, trials.error(pins), True, _with_ops(trials, pins), trials.num_conversions,
                               metric, trials.is_minimal)


def _shortest_suffix(trials: _Trials, candidates: list[str], tolerance: float) -> list[str]:
    """The last k candidates, k found by binary search, such that pinning them is enough. When the
    error is the sum of many small ones, an fp32 tail near the outputs is often enough by itself;
    this costs log2(N) trials, and the bisection then only searches inside the tail."""
    enough, not_enough = len(candidates), 0  # pinning all is enough (checked), none is not
    while enough - not_enough > 1:
        middle = (enough + not_enough) // 2
        if trials.error(candidates[len(candidates) - middle:]) <= tolerance:
            enough = middle
        else:
            not_enough = middle
    return candidates[len(candidates) - enough:]


def _minimize(trials: _Trials, candidates: list[str], fixed: frozenset, tolerance: float) -> list[str]:
    """A small subset S of `candidates` with error(fixed | S) <= tolerance, given that all of them suffice."""
    if trials.error(fixed) <= tolerance:
        return []
    if len(candidates) == 1:
        return list(candidates)
    if trials.is_spent:
        trials.is_minimal = False
        return list(candidates)
    first, second = candidates[:len(candidates) // 2], candidates[len(candidates) // 2:]
    if trials.error(fixed | set(first)) <= tolerance:
        return _minimize(trials, first, fixed, tolerance)
    if trials.error(fixed | set(second)) <= tolerance:
        return _minimize(trials, second, fixed, tolerance)
    from_first = _minimize(trials, first, fixed | set(second), tolerance)
    return from_first + _minimize(trials, second, fixed | set(from_first), tolerance)


def _with_ops(trials: _Trials, names) -> list:
    ops = {n.name: n.op_type for n in trials.prepared.model.graph.node}
    return [[name, ops[name]] for name in names]
