"""Graphs whose onnxruntime session creation crashes the process (a segfault in one of its graph
optimizers, which no `try` catches), or whose optimized session rounds otherwise than the model says
where that rounding decides a quantized value, as rules: the shape of the graph, and the optimizer to
turn off for a session over it. Only the sessions infc builds itself (tactic steps and their bridges,
islands) are concerned: their graphs come from infc's rewrites, e.g. the Casts of an fp16 plan."""

from __future__ import annotations

from typing import Callable, Iterable

MATMUL_OPS = frozenset({"MatMul", "FusedMatMul", "Gemm"})


def _transpose_cast_matmul(nodes: list) -> bool:
    # onnxruntime 1.32: MatmulTransposeFusion segfaults on Transpose(perm [1, 0, 2]) of an fp16 value
    # -> Cast to float -> MatMul (an fp16 plan of Longformer, whose attention output is sequence-first)
    producers = {out: node for node in nodes for out in node.output if out}
    for node in nodes:
        if node.op_type not in MATMUL_OPS:
            continue
        for name in node.input[:2]:
            cast = producers.get(name)
            if cast is not None and cast.op_type == "Cast":
                source = producers.get(cast.input[0])
                if source is not None and source.op_type == "Transpose":
                    return True
    return False


def _matmul_add_quantized(nodes: list) -> bool:
    # MatMulAddFusion makes MatMul + Add one Gemm, whose sum differs from the two steps' in the last
    # bit; a QuantizeLinear after it then lands a whole step away on values at its rounding ties (a
    # QDQ MatMul whose weight DequantizeLinear a plan folds: onnxruntime on the model keeps that one
    # a QDQ node unit and leaves it unfused; fuzz_graphs seeds 489, 726)
    producers = {out: node for node in nodes for out in node.output if out}
    has_quantize = any(node.op_type == "QuantizeLinear" for node in nodes)
    return has_quantize and any(node.op_type == "Add" and any(
        producers.get(name) is not None and producers[name].op_type == "MatMul" for name in node.input[:2])
        for node in nodes)


# (the optimizer to turn off, the graphs it crashes on or rounds otherwise than the model on)
KNOWN_CRASHES: tuple[tuple[str, Callable[[list], bool]], ...] = (
    ("MatmulTransposeFusion", _transpose_cast_matmul),
    ("MatMulAddFusion", _matmul_add_quantized),
)


def optimizers_to_disable(nodes: Iterable) -> list[str]:
    """Names for `InferenceSession(..., disabled_optimizers=...)` that keep a session over `nodes` alive."""
    nodes = list(nodes)
    return [optimizer for optimizer, crashes_on in KNOWN_CRASHES if crashes_on(nodes)]
