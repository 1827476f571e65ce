"""`infc optimize`: the pass pipeline from ONNX to ONNX."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import onnx

from .graph import export_model, import_graph
from .passes.pipeline import PIPELINE, PipelineResult, run_pipeline


@dataclass
class OptimizeResult:
    model: onnx.ModelProto
    pipeline: PipelineResult
    ops_before: Counter
    ops_after: Counter


def op_histogram(model: onnx.ModelProto) -> Counter:
    counts: Counter = Counter()

    def visit(graph: onnx.GraphProto):
        for node in graph.node:
            counts[node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"] += 1
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    visit(sub)

    visit(model.graph)
    return counts


def optimize_model(model: onnx.ModelProto, pipeline=PIPELINE, progress=None) -> OptimizeResult:
    graph = import_graph(model)
    result = run_pipeline(graph, pipeline, progress)
    optimized = export_model(graph, model)
    return OptimizeResult(optimized, result, op_histogram(model), op_histogram(optimized))
