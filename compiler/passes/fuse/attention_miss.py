"""Why an attention was not fused, where no attention rule matched its structure at all.

The attention rules name their reason when the pattern matches and a check declines (a layout, a
scale, a mask). When the graph's attention is shaped otherwise (a converter's Einsum lowered to 5-D
Transposes and Reshapes, scores over heads merged into the batch, a context that is not transposed
back), no pattern starts to match and nothing would be said. This pass looks at every Softmax left
after the fusions whose scores come from a product of two activations (Q·Kᵀ; a classifier's Softmax
over a weight product is not attention) and records the first place its structure leaves the form
the rules match, as a rejection of the attention rule for this opset. It changes nothing, and keeps
only its last round's findings, so a Softmax another pass made fusable later is not reported.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from ...graph import all_graphs, opset_of
from ..base import where
from ..stats import PassStats, RuleStats
from .attention_builder import producer

# What the rules allow between Q·Kᵀ and the Softmax: scales, soft-cap, masks
SCORE_OPS = frozenset({"Mul", "Div", "Tanh", "Where", "Add"})
PRODUCTS = frozenset({"MatMul", "FusedMatMul", "Einsum"})
MAX_DEPTH = 8  # how far above a Softmax a product of two activations is looked for


def _is_activation(t: gs.Tensor) -> bool:
    return not isinstance(t, gs.Constant)


def _path_to_product(softmax: gs.Node) -> list[gs.Node] | None:
    """Nodes from the Softmax's producer up to the nearest product of two activations (first
    activation input first), or None when there is none within MAX_DEPTH."""
    path, t = [], softmax.inputs[0]
    for _ in range(MAX_DEPTH):
        node = producer(t)
        if node is None:
            return None
        path.append(node)
        operands = node.inputs[1:] if node.op == "Where" else node.inputs  # a Where's condition is no score
        activations = [i for i in operands if _is_activation(i) and producer(i) is not None]
        if node.op in PRODUCTS and len([i for i in node.inputs if _is_activation(i)]) >= 2:
            return path
        if not activations:
            return None
        # the scores are the operand of the largest rank (a mask broadcasts)
        t = max(activations, key=lambda i: len(i.shape) if i.shape is not None else -1)
    return None


def _reader(t: gs.Tensor) -> gs.Node | None:
    readers = list(t.outputs)
    return readers[0] if len(readers) == 1 else None


def _described(nodes: list[gs.Node]) -> str:
    return ", ".join(n.op for n in nodes)  # no node names: one reason counts every place it holds


def diagnose(softmax: gs.Node, opset: int) -> str | None:
    """The first place a Softmax of Q·Kᵀ scores leaves the attention rules' form; None when it is
    not attention or its structure is theirs (their own checks then named the reason)."""
    path = _path_to_product(softmax)
    if path is None:
        return None
    product, between = path[-1], path[:-1]
    odd = [n for n in between if n.op not in SCORE_OPS]
    if odd:
        return (f"{_described(odd[::-1])} between the scores' {product.op} and the Softmax (the rules take only"
                " scale, soft-cap and mask ops there)")
    if product.op != "MatMul":
        return f"the scores come from {product.op}, not MatMul(Q, Kᵀ)"
    scores = softmax.inputs[0]
    if scores.shape is not None and len(scores.shape) != 4:
        return (f"the scores are {len(scores.shape)}-D {list(scores.shape)}, not (B, N, S, T): heads merged into"
                " the batch, or not split")
    probs = softmax.outputs[0]
    guard = _reader(probs)
    if guard is not None and guard.op == "Where":  # a NaN guard (torch's SDPA export)
        probs = guard.outputs[0]
    pv = _reader(probs)
    if pv is None or pv.op != "MatMul" or pv.inputs[0] is not probs:
        read_by = ", ".join(n.op for n in probs.outputs) or "the graph's outputs"
        return f"the probabilities are read by {read_by}, not by one MatMul with V"
    if opset >= 23:
        return None
    layout = _reader(pv.outputs[0])
    if layout is not None and layout.op == "Reshape":
        layout = _reader(layout.outputs[0])
    if layout is None or layout.op != "Transpose":
        read_by = ", ".join(n.op for n in pv.outputs[0].outputs) or "the graph's outputs"
        return f"the context P·V is read by {read_by}, not transposed to (B, S, N, H) and merged"
    return None  # the rules' form: their checks named the reason (a perm outside CONTEXT_PERMS, ...)


class ExplainUnfusedAttention:
    name = "explain_unfused_attention"

    def run(self, graph: gs.Graph, stats: PassStats) -> int:
        opset = opset_of(graph)
        rule = "attention_onnx" if opset >= 23 else "attention_mha"
        stats.rules[rule] = RuleStats()  # this round's findings only
        for g in all_graphs(graph):
            for node in g.nodes:
                if node.op == "Softmax" and node.domain in ("", None, "ai.onnx") and node.inputs:
                    reason = diagnose(node, opset)
                    if reason is not None:
                        stats.record_rejection(rule, reason, where(node))
        return 0
