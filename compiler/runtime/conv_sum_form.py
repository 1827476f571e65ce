"""A FusedConv with a residual input (Z) as onnxruntime is given it: Conv, Add, activation.

    x ─► FusedConv(W, B?, Z=z, activation=A?) ─► y      ==>  x ─► Conv(W, B?) ─► Add(·, z) ─► [A] ─► y

infc's conv_residual fusion writes the sum into FusedConv's Z, which saves infc's own kernels a
pass over memory. onnxruntime keeps such a node in NCHW unless Z is already in its blocked NCHWc
layout (the output of another NCHWc convolution): EfficientFormer's 14 MLP convolutions, whose
residual comes from a pooling block, ran as NCHW FusedConv in the plan's session, where the same
model as exported gave onnxruntime Conv + Add and it blocked all 33 convolutions (its NCHWc
transformer adds the sum into the convolution itself wherever it can). So every session infc
builds for onnxruntime (a tactic run, the whole-model variant) gets the sum in the form the
exporter wrote, and onnxruntime fuses it as it would for the user.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..unfused_form import constant_nodes, has_sum, unfused_nodes

if TYPE_CHECKING:  # the runtime loads plans without onnx (tests/runtime/test_executor.py); sessions import it
    import onnx

__all__ = ["conv_sum_nodes", "has_sum", "with_conv_sums_unfused"]


def conv_sum_nodes(inputs: list[str], output: str, attrs: dict, name: str = "") -> list[onnx.NodeProto] | None:
    """The Conv, Add and activation nodes (Clip's bounds as Constant nodes) that compute the
    FusedConv `attrs` (plain values, as decoded) over `inputs`; None when its activation has no form here."""
    unfused = unfused_nodes("FusedConv", inputs, output, attrs, name)
    if unfused is None:
        return None
    nodes, constants = unfused
    return constant_nodes(constants) + nodes


def with_conv_sums_unfused(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model (a copy when anything changes) with every FusedConv residual sum in the exporter's form."""
    if not any(has_sum(n.op_type, n.domain, list(n.input)) for n in model.graph.node):
        return model
    import onnx  # noqa: PLC0415
    from onnx import helper  # noqa: PLC0415

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    nodes = []
    for node in copy.graph.node:
        unfused = None
        if has_sum(node.op_type, node.domain, list(node.input)):
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            unfused = conv_sum_nodes(list(node.input), node.output[0], attrs, node.name or node.output[0])
        nodes += unfused or [node]
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy
