"""Removal of nodes that change nothing: Identity, Dropout at inference, Cast to the same type,
Reshape/Transpose/Squeeze-like ops that leave the shape as it is, arithmetic with neutral constants.

Each rule is a row of NOOP_RULES: the op type and a test that returns the passed-through input, or
a reason string when the node does change something in a way we can tell.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import const_value
from ..base import where
from ..stats import PassStats
from .bypass import bypass, bypass_reason

Decision = "gs.Tensor | str | None"  # the input to pass through, a rejection reason, or None (not a no-op)


def _identity(graph: gs.Graph, node: gs.Node):
    return node.inputs[0]


def _dropout(graph: gs.Graph, node: gs.Node):
    if len(node.outputs) > 1 and (node.outputs[1].outputs or node.outputs[1] in graph.outputs):
        return "its mask output is used"
    training = const_value(node.inputs[2]) if len(node.inputs) > 2 and not node.inputs[2].is_empty() else None
    if training is not None and bool(training):
        return "training_mode is on"
    if len(node.inputs) > 2 and not node.inputs[2].is_empty() and training is None:
        return "training_mode is not a constant"
    return node.inputs[0]


def _cast_same(graph: gs.Graph, node: gs.Node):
    src, to = node.inputs[0], node.attrs.get("to")
    if src.dtype is None or to is None:
        return None
    from ...lower import dtype_name  # noqa: PLC0415 - graphsurgeon keeps bfloat16 / float8 as TensorProto codes

    try:
        return src if dtype_name(src.dtype) == dtype_name(int(to)) else None
    except (TypeError, ValueError, KeyError):  # a type NumPy cannot name: keep the Cast
        return None


def _same_static_shape(graph: gs.Graph, node: gs.Node):
    src, out = node.inputs[0], node.outputs[0]
    if _is_static(src.shape) and _is_static(out.shape) and tuple(src.shape) == tuple(out.shape):
        if node.op == "Transpose":
            perm = node.attrs.get("perm")
            if perm is not None and list(perm) != list(range(len(perm))):
                return None  # same shape but elements move (e.g. a square matrix)
        return src
    if node.op == "Transpose":
        perm = node.attrs.get("perm")
        if perm is not None and list(perm) == list(range(len(perm))):
            return src
    return None


def _neutral_operand(neutral: float, commutes: bool):
    def decide(graph: gs.Graph, node: gs.Node):
        for data_index, const_index in ((0, 1), (1, 0)) if commutes else ((0, 1),):
            constant = const_value(node.inputs[const_index])
            data = node.inputs[data_index]
            if constant is None or constant.size == 0 or not np.all(constant == neutral):
                continue
            # The constant must not broadcast the data to a bigger shape or change its dtype.
            if data.shape is None or not _is_static(data.shape) or constant.ndim > len(data.shape):
                continue
            if data.dtype is not None and np.dtype(data.dtype) != constant.dtype:
                continue
            return data
        return None

    return decide


def _full_slice(graph: gs.Graph, node: gs.Node):
    steps = const_value(node.inputs[4]) if len(node.inputs) > 4 and not node.inputs[4].is_empty() else None
    if len(node.inputs) > 4 and not node.inputs[4].is_empty() and (steps is None or np.any(steps != 1)):
        return None  # a reversed or strided slice moves elements even when the shape stays
    return _same_static_shape(graph, node)


def _single_input_concat(graph: gs.Graph, node: gs.Node):
    return node.inputs[0] if len(node.inputs) == 1 else None


def _is_static(shape) -> bool:
    return shape is not None and all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape)


NOOP_RULES: tuple[tuple[str, str, Callable], ...] = (
    ("remove_identity", "Identity", _identity),
    ("remove_dropout", "Dropout", _dropout),
    ("remove_same_type_cast", "Cast", _cast_same),
    ("remove_noop_reshape", "Reshape", _same_static_shape),
    ("remove_noop_transpose", "Transpose", _same_static_shape),
    ("remove_noop_squeeze", "Squeeze", _same_static_shape),
    ("remove_noop_unsqueeze", "Unsqueeze", _same_static_shape),
    ("remove_noop_expand", "Expand", _same_static_shape),
    ("remove_noop_flatten", "Flatten", _same_static_shape),
    ("remove_noop_slice", "Slice", _full_slice),
    ("remove_add_zero", "Add", _neutral_operand(0.0, commutes=True)),
    ("remove_sub_zero", "Sub", _neutral_operand(0.0, commutes=False)),
    ("remove_mul_one", "Mul", _neutral_operand(1.0, commutes=True)),
    ("remove_div_one", "Div", _neutral_operand(1.0, commutes=False)),
    ("remove_single_input_concat", "Concat", _single_input_concat),
)


class RemoveNoOps:
    name = "remove_noops"

    def run(self, graph: gs.Graph, stats: PassStats) -> int:
        from ...graph import all_graphs

        by_op: dict[str, list] = {}
        for rule in NOOP_RULES:
            by_op.setdefault(rule[1], []).append(rule)
        num_changes = 0
        for g in all_graphs(graph):
            for node in list(g.nodes):
                for rule_name, _, decide in by_op.get(node.op, ()):
                    if not node.outputs or not node.inputs:
                        continue
                    decision = decide(g, node)
                    if decision is None:
                        continue
                    reason = decision if isinstance(decision, str) else bypass_reason(g, node, decision)
                    if reason is not None:
                        stats.record_rejection(rule_name, reason, where(node))
                        continue
                    bypass(g, node, decision)
                    stats.record_match(rule_name)
                    num_changes += 1
                    break
            if num_changes:
                g.cleanup().toposort()
        return num_changes
