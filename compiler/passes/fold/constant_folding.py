"""Constant folding: a node whose inputs are all constants becomes a constant.

Nodes are evaluated with onnx's reference implementation (always installed, exact ONNX semantics
for the model's own opset). Folding that would blow a small input up into a large constant
(ConstantOfShape, Expand, Tile, Range...) is declined with a reason, as ORT does.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx.reference import ReferenceEvaluator

from ...graph import all_graphs
from ..base import where
from ..stats import PassStats
from .shape_ops import fold_shape_node

NONDETERMINISTIC_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                                  "Multinomial", "Bernoulli"})
# A folded constant may be this big regardless of its inputs...
MAX_FREE_BYTES = 64 * 1024
# ...and beyond that at most this many times the bytes of its inputs.
MAX_GROWTH = 2.0


class FoldConstants:
    name = "constant_folding"

    def run(self, graph: gs.Graph, stats: PassStats) -> int:
        opsets = [onnx.helper.make_opsetid(d.domain, d.version) for d in _opset_imports(graph)]
        num_changes = 0
        for g in all_graphs(graph):
            protected = {id(t) for t in g.outputs}  # a graph output keeps its producer node
            for node in list(g.nodes):
                if not node.outputs or any(id(o) in protected for o in node.outputs):
                    continue
                if fold_shape_node(node, stats):
                    num_changes += 1
                    continue
                if not _is_foldable(node):
                    continue
                reason = self._fold(node, opsets)
                if reason:
                    stats.record_rejection("fold_constant_node", reason, where(node))
                else:
                    stats.record_match("fold_constant_node")
                    num_changes += 1
            if num_changes:
                g.cleanup().toposort()
        return num_changes

    def _fold(self, node: gs.Node, opsets) -> str | None:
        feeds = {}
        inputs = []
        for i, tensor in enumerate(node.inputs):
            name = "" if tensor.is_empty() else f"in{i}"
            inputs.append(name)
            if name:
                feeds[name] = np.asarray(tensor.values)
        outputs = [f"out{i}" for i in range(len(node.outputs))]
        proto = onnx.helper.make_node(node.op, inputs, outputs, domain=node.domain or "",
                                      **{k: _attr_for_proto(v) for k, v in node.attrs.items()})
        graph = onnx.helper.make_graph([proto], "fold",
                                       [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                                        for n, v in feeds.items()],
                                       [onnx.helper.make_value_info(n, onnx.TypeProto()) for n in outputs])
        model = onnx.helper.make_model(graph, opset_imports=opsets, ir_version=10)
        try:
            results = ReferenceEvaluator(model).run(None, feeds)
        except Exception as exc:  # noqa: BLE001 - any evaluator failure means "leave it"
            return f"reference evaluation failed ({type(exc).__name__})"
        input_bytes = sum(v.nbytes for v in feeds.values())
        output_bytes = sum(np.asarray(r).nbytes for r in results)
        if output_bytes > MAX_FREE_BYTES and output_bytes > MAX_GROWTH * input_bytes:
            return f"result would grow the model ({output_bytes} bytes from {input_bytes})"
        outs = list(node.outputs)
        node.inputs.clear()
        node.outputs.clear()
        for out, value in zip(outs, results):
            value = np.asarray(value)
            if out.dtype is not None and value.dtype != np.dtype(out.dtype):
                value = value.astype(out.dtype)
            out.to_constant(value)
        return None


def _is_foldable(node: gs.Node) -> bool:
    if node.op in NONDETERMINISTIC_OPS or (node.domain or "") not in ("", "ai.onnx"):
        return False
    if any(True for _ in node.subgraphs()) or not node.inputs:
        return False
    return all(isinstance(t, gs.Constant) or t.is_empty() for t in node.inputs)


def _opset_imports(graph: gs.Graph):
    domains = list(graph.import_domains or [])
    if not any(d.domain in ("", "ai.onnx") for d in domains):
        domains.append(onnx.helper.make_opsetid("", graph.opset))
    return domains


def _attr_for_proto(value):
    if isinstance(value, gs.Constant):
        return onnx.numpy_helper.from_array(np.asarray(value.values))
    if isinstance(value, np.ndarray):
        return onnx.numpy_helper.from_array(value)
    return value
