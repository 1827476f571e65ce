"""The verify report's note on outputs downstream of a selecting op (compiler/verify_selection.py)."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from infc.compiler.verify import OutputDiff
from infc.compiler.verify_selection import selection_note, selections_upstream


def _graph() -> onnx.GraphProto:
    """scores -> Relu -> TopK -> (values, indices) -> Mul -> picked; scores -> Sigmoid -> probs."""
    nodes = [helper.make_node("Relu", ["scores"], ["r"]),
             helper.make_node("TopK", ["r", "k"], ["values", "indices"], axis=-1),
             helper.make_node("Mul", ["values", "values"], ["picked"]),
             helper.make_node("Sigmoid", ["scores"], ["probs"])]
    return helper.make_graph(nodes, "g", [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [2, 8])],
                             [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("picked", "probs")],
                             [helper.make_tensor("k", TensorProto.INT64, [1], [3])])


def test_outputs_downstream_of_a_selection_are_found():
    assert selections_upstream(_graph(), ["picked", "probs", "indices"]) == {"picked": ["TopK"], "indices": ["TopK"]}


def test_a_note_only_for_large_differences_past_a_selection():
    graph = _graph()
    small = [OutputDiff("picked", 1e-7, 1e-7, ()), OutputDiff("probs", 0.5, 0.5, (0, 1))]
    assert selection_note(graph, small) is None  # probs differ, but nothing selects on its way
    note = selection_note(graph, [OutputDiff("picked", 0.9, 1.05, (0, 2)), OutputDiff("probs", 0.0, 0.0, ())])
    assert note.startswith("picked depends on TopK: near-tied scores") and "--inputs" in note
