"""Values that are not tensors (ONNX sequences, maps, optionals) never leave an onnxruntime island:
the executor's values are arrays, so an island that makes one stays open, taking every later node,
until each node that reads it has joined.

    SequenceEmpty ─► Loop (SequenceInsert in its body) ─► ConcatFromSequence      one island
          (the Shape / Gather between them, native or not, join it too)

A value is a sequence where shape inference typed it so, where a sequence op made it, or where a
sequence op reads it at a sequence slot (a Loop's scan-carried output has no type after some passes).

Since the island takes every node between the sequence's maker and its last reader, a maker sits
just before its first reader (`sink_sequence_makers`): a SequenceEmpty has no inputs, so a toposort
lists it first, and FastSpeech2's length regulator (SequenceEmpty ... Loop ... ConcatFromSequence)
took the whole encoder before it into onnxruntime."""

from __future__ import annotations

import onnx_graphsurgeon as gs

NON_TENSOR_TYPES = {"sequence_type", "map_type", "optional_type", "sparse_tensor_type"}
SEQUENCE_MAKERS = {"SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceErase", "SplitToSequence",
                   "SequenceMap", "Optional"}
# (op, input slot) that read a sequence or an optional
SEQUENCE_READS = {("ConcatFromSequence", 0), ("SequenceAt", 0), ("SequenceInsert", 0), ("SequenceErase", 0),
                  ("SequenceLength", 0), ("SequenceMap", 0), ("OptionalGetElement", 0), ("OptionalHasElement", 0)}


def non_tensor_values(graph: gs.Graph) -> set[int]:
    """ids of the graph's values that are not tensors."""
    found = set()
    for node in graph.nodes:
        for out in node.outputs:
            if node.op in SEQUENCE_MAKERS or getattr(out, "type", "tensor_type") in NON_TENSOR_TYPES:
                found.add(id(out))
        for slot, value in enumerate(node.inputs):
            if (node.op, slot) in SEQUENCE_READS:
                found.add(id(value))
    return found


class OpenSequences:
    """The non-tensor values the pending island made that a node outside it still reads."""

    def __init__(self, graph: gs.Graph):
        self._non_tensor = non_tensor_values(graph)
        self._unread: dict[int, int] = {}  # value id -> readers not yet in the island

    def is_open(self) -> bool:
        return bool(self._unread)

    def joined(self, node: gs.Node) -> None:
        # a Loop body reading the sequence from the outer scope is one of its readers (graphsurgeon
        # lists the body's node among them): counted only as node.inputs, FastSpeech2's
        # SplitToSequence never closed and the island took the whole decoder after it
        for value in _values_read(node):
            if id(value) in self._unread:
                self._unread[id(value)] -= 1
                if self._unread[id(value)] <= 0:
                    del self._unread[id(value)]
        for out in node.outputs:
            if id(out) in self._non_tensor and out.outputs:
                self._unread[id(out)] = len(out.outputs)

    def closed(self) -> None:
        self._unread.clear()


def sink_sequence_makers(nodes: list[gs.Node], graph: gs.Graph) -> list[gs.Node]:
    """`nodes` (in topological order) with every node whose outputs are all non-tensor values moved
    down to just before the first node that reads one of them (in its inputs or in a subgraph)."""
    non_tensor = non_tensor_values(graph)
    is_maker = {id(n): bool(n.outputs) and all(id(o) in non_tensor for o in n.outputs) for n in nodes}
    deferred: dict[int, gs.Node] = {}  # value id -> its deferred maker
    order: list[gs.Node] = []

    def emit(node: gs.Node) -> None:
        for value in _values_read(node):
            maker = deferred.pop(id(value), None)
            if maker is not None:
                for out in maker.outputs:
                    deferred.pop(id(out), None)
                emit(maker)
        order.append(node)

    for node in nodes:
        if is_maker[id(node)]:
            deferred.update((id(out), node) for out in node.outputs)
        else:
            emit(node)
    for node in nodes:  # makers nothing reads (or only graph outputs), in their own order
        if any(deferred.get(id(out)) is node for out in node.outputs):
            for out in node.outputs:
                deferred.pop(id(out), None)
            emit(node)
    return order


def _values_read(node: gs.Node) -> list[gs.Tensor]:
    values = list(node.inputs)
    for sub in node.subgraphs(recursive=True):
        for inner in sub.nodes:
            values.extend(inner.inputs)
    return values
