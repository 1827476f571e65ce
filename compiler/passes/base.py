"""What every pass looks like to the pipeline: a name and `run(graph, stats) -> number of changes`."""

from __future__ import annotations

from typing import Protocol

import onnx_graphsurgeon as gs

from .stats import PassStats


class Pass(Protocol):
    name: str

    def run(self, graph: gs.Graph, stats: PassStats) -> int: ...


def where(node: gs.Node) -> str:
    """A stable label for a node in rejection records."""
    return node.name or (node.outputs[0].name if node.outputs else node.op)
