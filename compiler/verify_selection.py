"""Why a `--verify` difference may not be an error: the output is downstream of an op that selects
(NonMaxSuppression, TopK, ArgMax, ...). Two runtimes that agree to float32 noise upstream can still
order near-tied scores differently and so keep another box or index: onnxruntime with and without
its own graph optimizations does (an ultralytics nms=True export: 1.05 of the largest output apart
on random inputs, every box equal when both are fed the same scores). The verify report then names
the selecting ops instead of leaving a bare large number."""

from __future__ import annotations

import onnx

SELECTION_OPS = frozenset({"NonMaxSuppression", "TopK", "ArgMax", "ArgMin", "Unique", "NonZero"})
NOTE_ABOVE = 1e-3  # relative differences below this need no explanation


def selections_upstream(graph: onnx.GraphProto, output_names) -> dict[str, list[str]]:
    """Output name -> the selecting op types its value depends on (sorted; outputs with none left out)."""
    producer = {out: node for node in graph.node for out in node.output if out}
    found: dict[str, list[str]] = {}
    for name in output_names:
        seen, stack, ops = set(), [name], set()
        while stack:
            node = producer.get(stack.pop())
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if node.domain in ("", "ai.onnx") and node.op_type in SELECTION_OPS:
                ops.add(node.op_type)
            stack.extend(i for i in node.input if i)
        if ops:
            found[name] = sorted(ops)
    return found


def selection_note(graph: onnx.GraphProto, diffs) -> str | None:
    """A line for the verify report when an output past NOTE_ABOVE depends on a selecting op, else None."""
    large = [d.name for d in diffs if not d.max_rel_diff <= NOTE_ABOVE]
    upstream = selections_upstream(graph, large)
    if not upstream:
        return None
    ops = sorted({op for names in upstream.values() for op in names})
    return (f"{', '.join(upstream)} depend{'s' if len(upstream) == 1 else ''} on {', '.join(ops)}: near-tied scores "
            "on random inputs can select other elements than onnxruntime does (onnxruntime with and without its "
            "graph optimizations can differ the same way); check with --inputs of real data")
