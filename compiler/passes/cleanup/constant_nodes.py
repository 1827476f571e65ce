"""Weights stored as `Constant` nodes (paddle2onnx and spox write them, also inside `If` bodies)
become constant tensors, so every later pass sees them as it sees initializers."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...graph import all_graphs
from ..base import where
from ..stats import PassStats

_SCALAR_ATTRS = {
    "value_float": np.float32,
    "value_int": np.int64,
    "value_floats": np.float32,
    "value_ints": np.int64,
}


def constant_node_value(node: gs.Node) -> np.ndarray | None:
    for key, value in node.attrs.items():
        if key == "value":
            if isinstance(value, gs.Constant):
                return np.asarray(value.values)
            if isinstance(value, onnx.TensorProto):
                return onnx.numpy_helper.to_array(value)
        if key in _SCALAR_ATTRS and value is not None:
            return np.asarray(value, dtype=_SCALAR_ATTRS[key])
    return None  # sparse_value and string forms stay as nodes


class ConstantNodesToTensors:
    name = "constant_nodes"

    def run(self, graph: gs.Graph, stats: PassStats) -> int:
        num_changes = 0
        for g in all_graphs(graph):
            for node in list(g.nodes):
                if node.op != "Constant" or len(node.outputs) != 1:
                    continue
                value = constant_node_value(node)
                if value is None:
                    stats.record_rejection("constant_node_to_tensor", "unsupported Constant attribute", where(node))
                    continue
                out = node.outputs[0]
                if out in g.outputs:
                    continue  # an initializer cannot double as a graph output in every runtime
                node.outputs.clear()
                out.to_constant(value)
                stats.record_match("constant_node_to_tensor")
                num_changes += 1
            if num_changes:
                g.cleanup().toposort()
        return num_changes
