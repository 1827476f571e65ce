"""Dead nodes and unused initializers go; graph inputs stay (they are the model's interface)."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from ...graph import node_count
from ..stats import PassStats


class RemoveDeadCode:
    name = "dead_code"

    def run(self, graph: gs.Graph, stats: PassStats) -> int:
        before = node_count(graph)
        graph.cleanup(remove_unused_graph_inputs=False, recurse_subgraphs=True).toposort()
        removed = before - node_count(graph)
        if removed:
            stats.record_match("remove_dead_nodes", removed)
        return removed
