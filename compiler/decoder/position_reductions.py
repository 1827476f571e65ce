"""Reductions over a step's positions, which a flat batch of sequences would mix.

    position_ids ─► ReduceMax ─► Add(1) ─► Greater(original_max) ─► Where(·, long_freq, short_freq) ─► ...
                    (longrope: Phi-3.5 / Phi-4-mini; the graph picks its rotary frequencies by the
                     longest position it is given)

Run on one sequence, as exported, the maximum is that sequence's own; run on a paged step it would
be the longest of every sequence in the step, so one request's numbers would depend on the others.
What the maximum decides is computed here: the nodes that depend on it alone (its "cone"), run for
the maxima a plan can see, 0 .. decode.max_model_len - 1: each of the first EXHAUSTIVE, then
PROBES spread over the rest (these choices are thresholds on the length: once changed, they stay
changed, so a change between two probes shows at the later one). When all give the same tensors,
those tensors become constants and the reduction is gone. When they do not, the build is refused,
naming the first position where the choice changes (found by bisection): a plan whose
max_model_len stays at or below it is exact.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..errors import BadInput
from ..lower import lower_graph
from ..runtime.executor import Executor
from ..runtime.kernels import has_kernel

POSITIONS = "position_ids"
PASS_THROUGH = {"Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten"}  # per-token still
EXHAUSTIVE, PROBES = 4096, 4096  # each cone run costs ~0.1 ms
REDUCTIONS = {"ReduceMax", "ReduceMin", "ReduceSum", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin", "CumSum"}


def fold_position_reductions(graph: gs.Graph, max_model_len: int) -> None:
    positions = next((t for t in graph.inputs if t.name == POSITIONS), None)
    for node in _reductions_of(positions) if positions is not None else []:
        if node.op != "ReduceMax" or _has_axes(node):  # over all axes: the step's largest position
            raise BadInput(f"not a recognized decoder: '{node.name}' ({node.op}) combines the positions of all "
                           "tokens of a step, which a batch of sequences would mix")
        cone = _cone(graph, node.outputs[0])
        frontier = _frontier(graph, cone)
        if not frontier:
            continue
        values, changes = _values_and_first_change(graph, node.outputs[0], frontier, max_model_len)
        if changes is not None:
            raise BadInput(f"not a recognized decoder: '{node.name}' takes the largest position of a step and the model "
                           f"changes with it at position {changes} (longrope or dynamic rope scaling?); a step batches "
                           f"sequences of other lengths, so decode.max_model_len must be at most {changes}")
        for tensor, value in zip(frontier, values):  # exact for every position the plan holds
            tensor.inputs.clear()  # off its producer, which cleanup then drops with the reduction
            tensor.to_constant(np.asarray(value))
        graph.cleanup()


def _reductions_of(positions: gs.Tensor) -> list[gs.Node]:
    """Nodes that combine tokens, reached from position_ids through per-token reshapes and casts."""
    found, frontier = [], [positions]
    while frontier:
        for node in frontier.pop().outputs:
            if node.op in REDUCTIONS:
                found.append(node)
            elif node.op in PASS_THROUGH:
                frontier.append(node.outputs[0])
    return found


def _has_axes(node: gs.Node) -> bool:
    return node.attrs.get("axes") is not None or len(node.inputs) > 1 and not node.inputs[1].is_empty()


def _cone(graph: gs.Graph, source: gs.Tensor) -> list[gs.Node]:
    """Nodes whose every non-constant input comes from `source` or from nodes of the cone."""
    inside, cone = {id(source)}, []
    graph.toposort()
    for node in graph.nodes:
        variables = [t for t in node.inputs if not t.is_empty() and not isinstance(t, gs.Constant)]
        if variables and all(id(t) in inside for t in variables):
            cone.append(node)
            inside.update(id(t) for t in node.outputs)
    return cone


def _frontier(graph: gs.Graph, cone: list[gs.Node]) -> list[gs.Tensor]:
    """Outputs of the cone read outside it (or graph outputs)."""
    members = {id(n) for n in cone}
    outputs = {id(t) for t in graph.outputs}
    return [t for n in cone for t in n.outputs
            if id(t) in outputs or any(id(c) not in members for c in t.outputs)]


def _values_and_first_change(graph: gs.Graph, source: gs.Tensor, frontier: list[gs.Tensor],
                             max_model_len: int) -> tuple[list[np.ndarray], int | None]:
    """The frontier's values for a maximum of 0, and the first maximum that changes them (or None)."""
    sub = graph.copy()
    tensors = sub.tensors()
    sub_source = tensors[source.name]
    sub_source.inputs.clear()
    sub.inputs = [sub_source]
    sub.outputs = [tensors[t.name] for t in frontier]
    sub.cleanup(remove_unused_graph_inputs=True).toposort()
    program = lower_graph(sub, has_kernel, allow_fallback=True)
    executor = Executor(program.steps, program.weights, program.opset, program.islands,
                        output_names=[t.name for t in sub.outputs])
    dtype, shape = np.dtype(source.dtype or np.int64), [1] * len(source.shape or ())

    def values(maximum: int) -> list[np.ndarray]:
        out = executor.run({source.name: np.full(shape, maximum, dtype)})
        return [np.asarray(out[t.name]) for t in sub.outputs]

    first = values(0)

    def changed(maximum: int) -> bool:
        return not all(a.shape == b.shape and np.array_equal(a, b, equal_nan=True) for a, b in zip(values(maximum), first))

    rest = np.unique(np.linspace(EXHAUSTIVE, max_model_len - 1, PROBES).astype(np.int64)) if max_model_len > EXHAUSTIVE else []
    last = 0
    for maximum in [*range(1, min(max_model_len, EXHAUSTIVE)), *map(int, rest)]:
        if changed(maximum):
            while maximum - last > 1:  # the first change after the last probe that matched
                middle = (last + maximum) // 2
                last, maximum = (last, middle) if changed(middle) else (middle, maximum)
            return first, maximum
        last = maximum
    return first, None
