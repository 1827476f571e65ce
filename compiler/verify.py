"""Numerical verification: the original and the optimized model in onnxruntime on the same inputs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from .child_run import run_in_child
from .errors import BadInput, InfcError, error_reason
from .feeds import random_feeds
from .model_io import as_model_file, serialized
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
    """An onnxruntime session, the reference of every numerical check. A model onnxruntime refuses
    to load is bad input (exporters write some: torch's opset-11 T5 and DeBERTa apply Min and Clip to
    int64, which opset 11 does not allow); callers that load a model infc wrote report that as theirs."""
    ort = require_onnxruntime()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # failures surface as our one-line errors, not as ORT's log lines
    try:
        data = serialized(model)
        if data is not None:
            return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        with as_model_file(model) as path:  # past 2 GiB: through a file with external data (read at load)
            return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - ORT's reason, in one line
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BadInput(f"onnxruntime cannot load the model, the reference for numerical checks "
                       f"({reason.split(' : ')[-1][:240]})") from None


def compare_outputs(names, expected, actual) -> list[OutputDiff]:
    diffs = []
    for name, a, b in zip(names, expected, actual):
        a, b = _as_array(a), _as_array(b)
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


def _as_array(value) -> np.ndarray:
    """A sequence of maps (a ZipMap's output, as onnxruntime returns it: a list of dicts) as a
    [items, keys] array of its values, keys in sorted order, so it compares with a tolerance."""
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        keys = sorted(value[0])
        if all(sorted(item) == keys for item in value):
            return np.array([[item[k] for k in keys] for item in value])
    return np.asarray(value)


# Lengths tried, in order, for the symbolic dims nobody gave when the model does not run on the
# default random inputs: 1 where an exporter kept a dim symbolic but traced one length (a decoder
# with past, exported at one new token, whose logits are [batch, 1, vocab]); a convolutional front
# end (wav2vec2 / HuBERT over raw audio samples) needs hundreds of steps where a text model's dims
# get 7.
OTHER_LENGTHS = (1, 256, 1024, 4096)
# Beyond this length only a model with one free length is tried: with several (new tokens, past,
# encoder length) every attention's scores grow with their product, gigabytes at 4096 for a model
# that failed for another reason (a T5 decoder with past took 24 GB before being killed).
MAX_LENGTH_OF_SEVERAL = 256


def verify_models(original: onnx.ModelProto, optimized: onnx.ModelProto, seed: int = 0,
                  feeds: dict | None = None, dims: dict | None = None) -> list[OutputDiff]:
    names = [o.name for o in original.graph.output]
    reference = ort_session(original)
    if feeds is not None:
        expected = _run_original(reference, names, feeds)
    else:
        feeds, expected = _random_feeds_that_run(original, reference, names, seed, dims or {})
    try:
        actual = ort_session(optimized).run(names, feeds)
    except Exception as exc:  # noqa: BLE001
        raise InfcError(f"onnxruntime cannot run the optimized model: {error_reason(exc)}") from None
    return compare_outputs(names, expected, actual)


def _run_original(session, names, feeds):
    try:
        return session.run(names, feeds)
    except Exception as exc:  # noqa: BLE001 - report ORT's reason in one line
        raise BadInput(f"onnxruntime cannot run the original model on generated inputs "
                       f"({error_reason(exc)}); give inputs with --inputs or dims with --dim") from None


# Made-up feeds first run in a forked child for models up to this size (child_run.py): onnxruntime
# dies with SIGFPE on WeSpeaker's front end fed fewer samples than one window, which took
# `optimize --verify` with it (exit 136) before it could try longer lengths.
PROBE_MAX_BYTES = 256 << 20


def _run_made_up(model: onnx.ModelProto, session, names, feeds):
    """The original model on feeds infc made up: where onnxruntime would die of them (a signal, a
    hang) in a child, a BadInput saying so, as for any other failure."""
    data = serialized(model)
    if data is not None and len(data) <= PROBE_MAX_BYTES:
        def once():
            ort_session(model).run(names, feeds)

        _, failure = run_in_child(once)
        if failure is not None and not failure.startswith("it raised"):  # errors: the run here words them
            raise BadInput(f"{failure} running the original model on generated inputs; give inputs with --inputs "
                           "or dims with --dim")
    return _run_original(session, names, feeds)


def _random_feeds_that_run(model: onnx.ModelProto, session, names, seed: int, dims: dict):
    """Random feeds at the default dims, else with every free symbolic dim but the batch at each of
    OTHER_LENGTHS in turn, then all that again at batch 1; the first failure is the one reported."""
    feeds = random_feeds(model, seed, dims)
    try:
        return feeds, _run_made_up(model, session, names, feeds)
    except BadInput as first:
        free = [d for d in _symbolic_dims(model, skip_batch=True) if d not in dims]
        batch = [d for d in _symbolic_dims(model, skip_batch=False) if d not in free and d not in dims]
        lengths = [n for n in OTHER_LENGTHS if len(free) == 1 or n <= MAX_LENGTH_OF_SEVERAL] if free else []
        # a batch pinned to 1 though named symbolic: a recurrent model's state input exported at
        # batch 1 ([layers, 1, hidden]) next to a [batch_size, ...] input
        attempts = [dict.fromkeys(free, n) for n in lengths]
        if batch:
            attempts += [{**dict.fromkeys(batch, 1), **a} for a in [{}, *attempts]]
        for attempt in attempts:
            feeds = random_feeds(model, seed, {**dims, **attempt})
            try:
                return feeds, _run_made_up(model, session, names, feeds)
            except Exception:  # noqa: BLE001, S112 - try the next dims
                continue
        raise first from None


def _symbolic_dims(model: onnx.ModelProto, skip_batch: bool) -> list[str]:
    """The inputs' dim names; with skip_batch, without those named like a batch or leading an input
    of rank 2 or more (dynamo names every dim s<N>)."""
    initializers = {t.name for t in model.graph.initializer}
    found, batch = [], set()
    for value in model.graph.input:
        if value.name not in initializers:
            shape = value.type.tensor_type.shape.dim
            for axis, dim in enumerate(shape):
                if dim.dim_param and dim.dim_param not in found:
                    found.append(dim.dim_param)
                if dim.dim_param and ("batch" in dim.dim_param.lower() or (axis == 0 and len(shape) >= 2)):
                    batch.add(dim.dim_param)
    return [d for d in found if not (skip_batch and d in batch)]
