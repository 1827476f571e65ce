"""Decoder inputs that name the rows whose logits a step wants: served as infc.logits_indices.

    logits_to_keep / num_logits_to_keep [k] (transformers >= 4.45 with a tensor: the LM head reads
    hidden[:, logits_to_keep]) ==> the graph input infc.logits_indices, which the runner feeds with
    the rows that need logits (each sequence's last scheduled token), the Gather canonicalize.py
    would otherwise insert in front of the LM head.

A scalar index picks one row for the whole step, which a step of several sequences cannot use: it
is refused with the reason. (Given as a Python int, logits_to_keep is no input of the export.)
What the runner feeds besides (input_ids, position_ids, cache_position, attention_mask,
token_type_ids) is canonicalize.TOKEN_INPUTS.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from ..errors import BadInput
from .sites import NOT_RECOGNIZED

ROW_INDEX_INPUTS = ("logits_to_keep", "num_logits_to_keep")


def logits_rows_input(model: onnx.ModelProto, logits_indices: str) -> tuple[onnx.ModelProto, list[str]]:
    """The model with its 1-D row-index input renamed `logits_indices` (a copy; the model itself
    when it has none), and the names it had."""
    found = [i for i in model.graph.input if i.name in ROW_INDEX_INPUTS]
    if not found:
        return model, []
    for info in found:
        tensor_type = info.type.tensor_type
        if not tensor_type.HasField("shape") or len(tensor_type.shape.dim) != 1:
            raise BadInput(f"{NOT_RECOGNIZED}: input '{info.name}' is a scalar row index: it picks one row of a step, "
                           "which holds tokens of several sequences; export it 1-D (rows to keep) or without it")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    renamed = {i.name: logits_indices for i in found}
    for info in out.graph.input:
        if info.name in renamed:
            info.name = logits_indices
            info.type.tensor_type.elem_type = TensorProto.INT64
    _rename_uses(out.graph, renamed)
    return out, list(renamed)


def _rename_uses(graph: onnx.GraphProto, renamed: dict[str, str]) -> None:
    for node in graph.node:
        node.input[:] = [renamed.get(n, n) for n in node.input]
        for attribute in node.attribute:
            for sub in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs):
                _rename_uses(sub, renamed)
