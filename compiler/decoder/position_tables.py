"""Rotary tables sliced to the sequence's length before they are read at each token's position, as
older transformers exports do (Llama / Mistral / Mixtral before 4.38: cos_cached[:seq_len] with
seq_len = past length + new tokens, then [position_ids]):

    table (L, D) ─► Slice(0 : past_len + new, axis 0) ─► Gather(·, position_ids) ─► ...
                                                         GatherND(·, Unsqueeze(position_ids, -1))  (dynamo)

A paged step has no past input, so the slice would end at the step's own token count and cut the
rows that later positions read. Positions are non-negative and below the sequence's length, so the
slice never drops a row that the Gather reads: Gather(table, position_ids) is the same. (The past
length must not reach anything the paged graph still computes; canonicalize.py refuses it.)
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..graph import const_value
from .position_reductions import PASS_THROUGH, POSITIONS


def _reads_positions(t: gs.Tensor) -> bool:
    while t.name != POSITIONS:
        node = t.inputs[0] if len(t.inputs) == 1 else None
        if node is None or node.op not in PASS_THROUGH:
            return False
        t = node.inputs[0]
    return True


def _prefix_slice(node: gs.Node) -> gs.Tensor | None:
    """The table of Slice(table, [0], ends, [0] (, [1])) along axis 0, ends computed at run time."""
    if node is None or node.op != "Slice" or len(node.inputs) < 3 or const_value(node.inputs[0]) is None:
        return None
    starts = const_value(node.inputs[1])
    axes = const_value(node.inputs[3]) if len(node.inputs) > 3 and not node.inputs[3].is_empty() else np.zeros(1)
    steps = const_value(node.inputs[4]) if len(node.inputs) > 4 and not node.inputs[4].is_empty() else np.ones(1)
    if starts is None or axes is None or steps is None or const_value(node.inputs[2]) is not None:
        return None
    return node.inputs[0] if starts.tolist() == [0] and axes.tolist() == [0] and steps.tolist() == [1] else None


def _indexes_positions(node: gs.Node) -> bool:
    """Gather(·, positions, axis 0), or GatherND(·, Unsqueeze(positions, -1)) as dynamo writes cos[ids]."""
    if node.op == "Gather":
        return node.attrs.get("axis", 0) == 0 and _reads_positions(node.inputs[1])
    if node.op != "GatherND" or node.attrs.get("batch_dims", 0) != 0:
        return False
    index = node.inputs[1].inputs[0] if len(node.inputs[1].inputs) == 1 else None
    if index is None or index.op != "Unsqueeze" or index.inputs[0].shape is None:
        return False
    axes = index.attrs.get("axes")
    axes = axes if axes is not None else const_value(index.inputs[1]) if len(index.inputs) > 1 else None
    rank = len(index.inputs[0].shape) + 1
    return axes is not None and [int(a) % rank for a in np.ravel(axes)] == [rank - 1] and _reads_positions(index.inputs[0])


def read_tables_whole(graph: gs.Graph) -> int:
    """Gather(Slice(table, 0 : length), positions) -> Gather(table, positions) (GatherND too); how many."""
    folded = 0
    for node in graph.nodes:
        if node.op not in ("Gather", "GatherND") or not _indexes_positions(node):
            continue
        source = node.inputs[0].inputs[0] if len(node.inputs[0].inputs) == 1 else None
        table = _prefix_slice(source)
        if table is not None:
            node.inputs[0] = table
            folded += 1
    if folded:
        graph.cleanup()
    return folded
