"""Nodes put in topological order on load, as onnxruntime does.

Converters that append nodes after the fact write graphs whose nodes are not in order: onnxconverter's
float16 conversion (ultralytics' `export(half=True)` on the CPU) appends the Casts of the graph's
inputs and outputs at the end, after the nodes that read them. onnxruntime sorts such a graph and runs
it; onnx's checker rejects it ("Nodes in a graph must be topologically sorted"). The graph is known to
be acyclic here (model_io checks that first), so a stable sort always succeeds.
"""

from __future__ import annotations

import heapq

import onnx


def sort_topologically(graph: onnx.GraphProto) -> bool:
    """Reorder the graph's nodes (and its subgraphs') so each comes after the producers of what it
    reads; nodes already in order keep their places. True when anything moved."""
    moved = False
    for node in graph.node:
        for attr in node.attribute:
            for sub in _subgraphs(attr):
                moved |= sort_topologically(sub)
    nodes = list(graph.node)
    order = _stable_order(nodes)
    if order == list(range(len(nodes))):
        return moved
    del graph.node[:]
    graph.node.extend(nodes[i] for i in order)
    return True


def _stable_order(nodes: list[onnx.NodeProto]) -> list[int]:
    """Kahn's algorithm taking the lowest index ready: a sorted graph comes back unchanged."""
    producer = {out: i for i, node in enumerate(nodes) for out in node.output if out}
    waiting_on = []
    readers: list[list[int]] = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        parents = {producer[name] for name in _names_read(node) if name in producer} - {i}
        waiting_on.append(len(parents))
        for parent in parents:
            readers[parent].append(i)
    ready = [i for i, count in enumerate(waiting_on) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for reader in readers[i]:
            waiting_on[reader] -= 1
            if waiting_on[reader] == 0:
                heapq.heappush(ready, reader)
    return order if len(order) == len(nodes) else list(range(len(nodes)))  # a cycle: left for the checker to name


def _names_read(node: onnx.NodeProto) -> set[str]:
    """The node's inputs and every name its subgraphs read (an If branch may read an outer value
    directly, which orders the If after that value's producer just as an input would)."""
    names = {name for name in node.input if name}
    for attr in node.attribute:
        for sub in _subgraphs(attr):
            for inner in sub.node:
                names |= _names_read(inner)
    return names


def _subgraphs(attr: onnx.AttributeProto) -> list[onnx.GraphProto]:
    if attr.type == onnx.AttributeProto.GRAPH:
        return [attr.g]
    if attr.type == onnx.AttributeProto.GRAPHS:
        return list(attr.graphs)
    return []
