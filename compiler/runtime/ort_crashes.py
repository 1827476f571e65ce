"""Graphs whose onnxruntime session creation crashes the process (a segfault in one of its graph
optimizers, which no `try` catches), as rules: the shape of the graph, and the optimizer to turn off
for a session over it. Only the sessions infc builds itself (tactic steps and their bridges,
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


# (the optimizer onnxruntime crashes in, the graphs it crashes on)
KNOWN_CRASHES: tuple[tuple[str, Callable[[list], bool]], ...] = (
    ("MatmulTransposeFusion", _transpose_cast_matmul),
)


def optimizers_to_disable(nodes: Iterable) -> list[str]:
    """Names for `InferenceSession(..., disabled_optimizers=...)` that keep a session over `nodes` alive."""
    nodes = list(nodes)
    return [optimizer for optimizer, crashes_on in KNOWN_CRASHES if crashes_on(nodes)]
