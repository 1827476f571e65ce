"""Removing a node that passes one of its inputs through unchanged, while keeping graph outputs."""

from __future__ import annotations

import onnx_graphsurgeon as gs


def bypass_reason(graph: gs.Graph, node: gs.Node, source: gs.Tensor) -> str | None:
    out = node.outputs[0]
    if out in graph.outputs and (source in graph.inputs or source in graph.outputs or isinstance(source, gs.Constant)
                                 or len(source.inputs) != 1 or not any(n is source.inputs[0] for n in graph.nodes)):
        # In a subgraph (an If branch, a Loop body) the source may come from the outer scope, and
        # onnxruntime refuses a subgraph that returns an outer value directly.
        return "would wire a graph input, constant, outer value or another output straight to a graph output"
    if out.dtype is not None and source.dtype is not None and out.dtype != source.dtype:
        return "input and output dtypes differ"
    return None


def bypass(graph: gs.Graph, node: gs.Node, source: gs.Tensor) -> None:
    """Make every consumer of `node`'s output read `source` instead; call bypass_reason first."""
    out = node.outputs[0]
    node.inputs.clear()
    node.outputs.clear()
    if out in graph.outputs:
        # The output name is the model's interface: let the source's producer write it directly.
        producer = source.inputs[0]
        producer.outputs[producer.outputs.index(source)] = out
        for consumer in list(source.outputs):
            _replace_input(consumer, source, out)
        return
    for consumer in list(out.outputs):
        _replace_input(consumer, out, source)


def _replace_input(consumer: gs.Node, old: gs.Tensor, new: gs.Tensor) -> None:
    for i, tensor in enumerate(consumer.inputs):
        if tensor is old:
            consumer.inputs[i] = new
