"""Common subexpression elimination: equal constants merge, then nodes with the same op, attributes
and inputs merge, in topological order so that merges cascade in one sweep."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import all_graphs
from ..stats import PassStats

# Ops whose two calls with equal inputs may differ.
NONDETERMINISTIC_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                                   "Multinomial", "Bernoulli", "Dropout"})


def _attr_key(value) -> str:
    if isinstance(value, gs.Tensor):
        return "tensor:" + _array_key(np.asarray(value.values)) if isinstance(value, gs.Constant) else f"var:{id(value)}"
    if isinstance(value, np.ndarray):
        return _array_key(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_attr_key(v) for v in value) + "]"
    return repr(value)


def _array_key(array: np.ndarray) -> str:
    digest = hashlib.sha1(np.ascontiguousarray(array).tobytes()).hexdigest()
    return f"{array.dtype}{array.shape}{digest}"


def _node_key(node: gs.Node) -> tuple | None:
    if node.op in NONDETERMINISTIC_OPS or node.op == "Constant" or any(True for _ in node.subgraphs()):
        return None
    attrs = tuple(sorted((k, _attr_key(v)) for k, v in node.attrs.items()))
    return (node.op, node.domain or "", tuple(id(t) for t in node.inputs), attrs, len(node.outputs))


class CommonSubexpressions:
    name = "cse"

    def run(self, graph: gs.Graph, stats: PassStats) -> int:
        num_changes = self._merge_constants(graph, stats)
        for g in all_graphs(graph):
            g.toposort(recurse_subgraphs=False)
            seen: dict[tuple, gs.Node] = {}
            protected = {id(t) for t in g.outputs}
            for node in list(g.nodes):
                key = _node_key(node)
                if key is None:
                    continue
                twin = seen.setdefault(key, node)
                if twin is node or any(id(o) in protected for o in node.outputs):
                    continue
                for mine, theirs in zip(list(node.outputs), twin.outputs):
                    for consumer in list(mine.outputs):
                        for i, t in enumerate(consumer.inputs):
                            if t is mine:
                                consumer.inputs[i] = theirs
                node.inputs.clear()
                node.outputs.clear()
                stats.record_match("merge_equal_nodes")
                num_changes += 1
            g.cleanup()
        return num_changes

    def _merge_constants(self, graph: gs.Graph, stats: PassStats) -> int:
        # Only small constants: hashing every large weight each round costs more than it saves.
        num_changes = 0
        for g in all_graphs(graph):
            seen: dict[str, gs.Constant] = {}
            for node in g.nodes:
                for i, tensor in enumerate(node.inputs):
                    if not isinstance(tensor, gs.Constant) or tensor.values.size > 4096:
                        continue
                    key = _array_key(np.asarray(tensor.values))
                    twin = seen.setdefault(key, tensor)
                    if twin is not tensor:
                        node.inputs[i] = twin
                        stats.record_match("merge_equal_constants")
                        num_changes += 1
        return num_changes

