"""Structural matching of a pattern against the graph, with commuted inputs and backtracking."""

from __future__ import annotations

from typing import Iterator

import onnx_graphsurgeon as gs

from .pattern import Capture, OpPattern, OutputRef, PatternValue

# Binary ops whose two inputs may be swapped; the matcher tries both orders.
COMMUTATIVE_OPS = frozenset({"Add", "Mul", "Max", "Min", "Sum", "Mean", "And", "Or", "Xor", "Equal"})


class Bindings:
    """Immutable-by-convention bindings; each branch of the search extends a copy."""

    __slots__ = ("values", "nodes")

    def __init__(self, values: dict[str, gs.Tensor] | None = None, nodes: dict[int, gs.Node] | None = None):
        self.values = values or {}
        self.nodes = nodes or {}

    def with_value(self, name: str, tensor: gs.Tensor) -> "Bindings":
        return Bindings({**self.values, name: tensor}, self.nodes)

    def with_node(self, pattern: OpPattern, node: gs.Node) -> "Bindings":
        return Bindings(self.values, {**self.nodes, id(pattern): node})


def _domain(node: gs.Node) -> str:
    return "" if node.domain in (None, "", "ai.onnx") else node.domain


def _present_inputs(node: gs.Node) -> list[gs.Tensor]:
    inputs = list(node.inputs)
    while inputs and inputs[-1].is_empty():  # trailing omitted optional inputs
        inputs.pop()
    return inputs


def match_node(pattern: OpPattern, node: gs.Node, bindings: Bindings) -> Iterator[Bindings]:
    bound = bindings.nodes.get(id(pattern))
    if bound is not None:
        if bound is node:
            yield bindings
        return
    if node.op not in pattern.op_types or _domain(node) != pattern.domain:
        return
    if any(bound is node for bound in bindings.nodes.values()):  # one graph node plays one pattern role
        return
    inputs = _present_inputs(node)
    if len(inputs) < len(pattern.inputs) or (len(inputs) > len(pattern.inputs) and not pattern.allow_extra_inputs):
        return
    inputs = inputs[: len(pattern.inputs)]
    extended = bindings.with_node(pattern, node)
    orders = [pattern.inputs]
    if node.op in COMMUTATIVE_OPS and len(pattern.inputs) == 2:
        orders.append(pattern.inputs[::-1])
    for order in orders:
        yield from _match_inputs(order, inputs, 0, extended)


def _match_inputs(patterns, tensors, index: int, bindings: Bindings) -> Iterator[Bindings]:
    if index == len(patterns):
        yield bindings
        return
    for after in match_value(patterns[index], tensors[index], bindings):
        yield from _match_inputs(patterns, tensors, index + 1, after)


def match_value(pattern: PatternValue, tensor: gs.Tensor, bindings: Bindings) -> Iterator[Bindings]:
    if isinstance(pattern, Capture):
        if pattern.is_const and not isinstance(tensor, gs.Constant):
            return
        previous = bindings.values.get(pattern.name)
        if previous is not None and previous is not tensor:
            return
        yield bindings.with_value(pattern.name, tensor)
        return
    node_pattern, index = (pattern.node, pattern.index) if isinstance(pattern, OutputRef) else (pattern, 0)
    if len(tensor.inputs) != 1:  # a graph input, an initializer or an outer-scope value
        return
    producer = tensor.inputs[0]
    if index >= len(producer.outputs) or producer.outputs[index] is not tensor:
        return
    yield from match_node(node_pattern, producer, bindings)
