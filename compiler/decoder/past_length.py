"""Proving that a paged graph does not compute with the past KV length it no longer has.

A paged step runs the model as if on an empty past (canonicalize.py turns every read of the past
inputs' shapes into constants with length 0). The causal mask that reads the length dies with the
attention bias; anything else still reading it would compute for past 0 instead of the sequence's
own, silently. Exporters do leave such reads in shape arithmetic whose value does not depend on the
length inside the plan's range (dynamo's GPT-Neo: the query rows as min(512, P + S) - min(512, P),
S while P + S <= 512). So the integer arithmetic that reads the length (scalar and 1-D integer ops)
is run on probes (P, S) up to max_model_len, and every value it hands to any other op must equal
its value at P = 0. A length that reaches a value that changes (rope scaled by the length: a Cast
to float of P + S) is refused, naming the op it reaches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from ..errors import BadInput
from ..lower import lower_graph
from ..runtime.executor import Executor
from ..runtime.kernels import has_kernel
from .mask_check import probe_feed

SHAPE_ARITHMETIC = {"Squeeze", "Unsqueeze", "Add", "Sub", "Mul", "Div", "Mod", "Min", "Max", "Neg", "Abs", "Reshape",
                    "Concat", "Cast", "Gather", "Slice", "Identity", "Equal", "Greater", "Less", "GreaterOrEqual",
                    "LessOrEqual", "Not", "And", "Or", "Where"}
PROBE = "infc.past_length_probe"


@dataclass
class LengthRead:
    value: gs.Tensor  # the constant that replaced Shape(past)[start:end]
    index: int  # where the past length sits in it


def _is_shape_value(t: gs.Tensor) -> bool:
    kind = np.dtype(t.dtype).kind if t.dtype is not None else ""
    return kind in "iub" and t.shape is not None and len(t.shape) <= 1


def _handed(reads: list[LengthRead]) -> list[gs.Tensor]:
    """The values that the integer arithmetic reading the lengths (scalar and 1-D integer ops) hands
    to any other op: a Reshape's shape, a Slice's bounds, a Cast to float, ..."""
    seen, frontier, handed = set(), [r.value for r in reads], {}
    while frontier:
        tensor = frontier.pop()
        for consumer in tensor.outputs:
            if consumer.op in SHAPE_ARITHMETIC and all(_is_shape_value(o) for o in consumer.outputs):
                if id(consumer) not in seen:
                    seen.add(id(consumer))
                    frontier.extend(consumer.outputs)
            else:
                handed[id(tensor)] = tensor
    return list(handed.values())


def check_past_length(graph: gs.Graph, reads: list[LengthRead], probes: list[tuple[int, int]]) -> None:
    live = [r for r in reads if r.value.outputs]
    if not live:
        return
    handed = _handed(live)
    sub = graph.copy()
    tensors = sub.tensors()
    probes_in = []
    for i, read in enumerate(live):
        value = tensors[read.value.name]
        variable = gs.Variable(f"{PROBE}.{i}", np.int64, list(value.values.shape))
        for consumer in list(value.outputs):
            for k, t in enumerate(list(consumer.inputs)):
                if t is value:
                    consumer.inputs[k] = variable
        probes_in.append((variable, np.asarray(read.value.values), read.index))
    sub.inputs = list(sub.inputs) + [v for v, _, _ in probes_in]
    replaced = {read.value.name: v for read, (v, _, _) in zip(live, probes_in)}  # a read handed on as it is
    sub.outputs = [replaced.get(t.name) or tensors[t.name] for t in handed]
    sub.cleanup(remove_unused_graph_inputs=True).toposort()
    program = lower_graph(sub, has_kernel, allow_fallback=True)
    executor = Executor(program.steps, program.weights, program.opset, program.islands,
                        output_names=[t.name for t in sub.outputs])
    for num_past, num_new in probes:
        at_zero, at_past = (executor.run(_feeds(sub, probes_in, p, num_new)) for p in (0, num_past))
        for t, original in zip(sub.outputs, handed):
            if not np.array_equal(at_zero[t.name], at_past[t.name]):
                reader = next(c for c in original.outputs if c.op not in SHAPE_ARITHMETIC or not all(
                    _is_shape_value(o) for o in c.outputs))
                _refuse(reader, f" (with {num_past} past and {num_new} new tokens it is {at_past[t.name].tolist()}, "
                                f"with no past {at_zero[t.name].tolist()})")


def _feeds(sub: gs.Graph, probes_in, num_past: int, num_new: int) -> dict:
    feeds = {}
    for t in sub.inputs:
        probe = next(((values, index) for v, values, index in probes_in if v.name == t.name), None)
        if probe is None:
            feeds[t.name] = probe_feed(t, num_past, num_new, reader="shape arithmetic on the past length")
            continue
        values = probe[0].copy()
        values.reshape(-1)[probe[1]] = num_past
        feeds[t.name] = values
    return feeds


def _refuse(reader: gs.Node, detail: str = "") -> None:
    raise BadInput(f"not a recognized decoder: '{reader.name}' ({reader.op}) computes with the past KV length{detail}, "
                   "which a paged step does not have (rope scaled by the length?)")
