"""Small model-level helpers shared by the precision and int8 passes."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

FLOAT = onnx.TensorProto.FLOAT


def named_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose nodes all have unique names (`<op>_<index>` for unnamed or repeated ones), so a
    node is the same node across conversions of the same original (repair pins by name)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    seen = set()
    for index, node in enumerate(copy.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{index}"
        seen.add(node.name)
    return copy


def float_constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """fp32 initializers (not overridable graph inputs) and fp32 Constant node outputs, by name."""
    graph_inputs = {v.name for v in model.graph.input}
    found = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
             if t.data_type == FLOAT and t.name not in graph_inputs}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.name == "value" and attr.t.data_type == FLOAT:
                    found[node.output[0]] = numpy_helper.to_array(attr.t)
    return found


def outer_names_used_by_subgraphs(graph: onnx.GraphProto) -> set[str]:
    used = set()
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                defined = {o for n in sub.node for o in n.output} | {i.name for i in sub.input} | {t.name for t in sub.initializer}
                used |= {i for n in sub.node for i in n.input if i and i not in defined}
                used |= outer_names_used_by_subgraphs(sub)
    return used


def drop_unused(graph: onnx.GraphProto) -> None:
    """Initializers and Constant nodes nobody reads any more (e.g. fp32 copies of retyped weights)."""
    while True:
        used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output} | outer_names_used_by_subgraphs(graph)
        dead = [n for n in graph.node if n.op_type == "Constant" and not any(o in used for o in n.output)]
        for node in dead:
            graph.node.remove(node)
        if not dead:
            break
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def set_metadata(model: onnx.ModelProto, key: str, value: str) -> None:
    entries = [p for p in model.metadata_props if p.key != key]
    del model.metadata_props[:]
    model.metadata_props.extend(entries)
    model.metadata_props.add(key=key, value=value)


def get_metadata(model: onnx.ModelProto, key: str) -> str | None:
    return next((p.value for p in model.metadata_props if p.key == key), None)
