"""Whether nodes a rewrite wrote exist, in the form written, at the graph's opset.

Fusions write standard ops (Expand, Where, LayerNormalization, Unsqueeze with its axes as an input)
that older opsets lack or spell differently: an opset-7 model whose attention fusion wrote an Expand
(opset 8) no longer loads (fuzz_graphs --forms old seed 128). The engine asks this of every
replacement before splicing it, so each rule declines with the reason instead of each rule checking
the opset of every op it writes."""

from __future__ import annotations

from functools import lru_cache

import onnx
import onnx_graphsurgeon as gs


# ops onnxruntime registers in the default domain at every opset, outside onnx's schemas (its
# LayerNormalization kernel predates opset 17's; SimplifiedLayerNormalization is its own)
ORT_DEFAULT_DOMAIN_OPS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization"})


@lru_cache(maxsize=None)
def _schema(op: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return None


def form_missing(nodes: list[gs.Node], opset: int) -> str | None:
    """A reason naming the first default-domain node `opset` cannot express, or None."""
    for node in nodes:
        if node.domain not in (None, "", "ai.onnx") or node.op in ORT_DEFAULT_DOMAIN_OPS:
            continue  # contrib and infc ops carry their own domain versions
        schema = _schema(node.op, opset)
        if schema is None:
            return f"{node.op} does not exist at opset {opset}"
        num_inputs = len(node.inputs)
        while num_inputs and _is_empty(node.inputs[num_inputs - 1]):
            num_inputs -= 1
        if num_inputs > schema.max_input:
            return f"{node.op} takes at most {schema.max_input} inputs at opset {opset}"
        unknown = sorted(set(node.attrs) - set(schema.attributes))
        if unknown:
            return f"{node.op} has no attribute {unknown[0]} at opset {opset}"
    return None


def _is_empty(tensor) -> bool:
    return isinstance(tensor, gs.Variable) and tensor.name == ""
