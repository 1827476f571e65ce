"""The optimization pipeline, as data: phases in order, each an ordered list of passes with the
reason it sits where it does. Each phase runs to a fixed point (no pass changes anything)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import onnx_graphsurgeon as gs

from ..graph import node_count
from .base import Pass
from .cleanup.constant_nodes import ConstantNodesToTensors
from .cleanup.cse import CommonSubexpressions
from .cleanup.dead_code import RemoveDeadCode
from .cleanup.noop import RemoveNoOps
from .engine import RewritePass
from .fold import batchnorm, conv_affine
from .fold.constant_folding import FoldConstants
from .fold.shape_inference import InferShapes
from .stats import PassStats

MAX_ROUNDS = 8


@dataclass(frozen=True)
class Step:
    pass_: Pass
    why: str


@dataclass(frozen=True)
class Phase:
    name: str
    steps: tuple[Step, ...]


PIPELINE: tuple[Phase, ...] = (
    Phase("cleanup", (
        Step(ConstantNodesToTensors(), "weights kept as Constant nodes must look like initializers to every later pass"),
        Step(RemoveNoOps(), "Identity/Dropout/no-op casts hide the producer-consumer pairs that patterns match"),
        Step(RemoveDeadCode(), "drop what the removals orphaned before paying for shape inference"),
    )),
    Phase("fold", (
        Step(InferShapes(), "static shapes let Shape chains and no-op reshapes fold; first, so the rest can use them"),
        Step(FoldConstants(), "turns static Shape chains and constant arithmetic into constants"),
        Step(CommonSubexpressions(), "exporters repeat shape computations; merged, they fold and match once"),
        Step(RewritePass("fold_batchnorm", batchnorm.RULES), "BN into its Conv before Conv epilogue fusions look at the Conv"),
        Step(RewritePass("fold_conv_affine", conv_affine.RULES), "per-channel Add/Mul into Conv bias and weights, also after BN folding"),
        Step(RemoveNoOps(), "folding exposes reshapes to the same shape and neutral arithmetic"),
        Step(RemoveDeadCode(), "folded subgraphs leave dead nodes and initializers"),
    )),
    Phase("fuse", (
    )),
    Phase("layout", (
    )),
    Phase("final", (
        Step(CommonSubexpressions(), "fusions can create equal nodes (e.g. one Transpose of a shared weight)"),
        Step(RemoveDeadCode(), "leave nothing unused in the written model"),
    )),
)


@dataclass
class PipelineResult:
    stats: list[PassStats]
    nodes_before: int
    nodes_after: int
    time_s: float

    def to_json(self) -> dict:
        return {"nodes_before": self.nodes_before, "nodes_after": self.nodes_after, "time_s": round(self.time_s, 4),
                "passes": [s.to_json() for s in self.stats]}


def run_pipeline(graph: gs.Graph, pipeline: tuple[Phase, ...] = PIPELINE, progress=None) -> PipelineResult:
    start = time.perf_counter()
    nodes_before = node_count(graph)
    all_stats: list[PassStats] = []
    for phase in pipeline:
        stats = [PassStats(step.pass_.name, phase.name, step.why) for step in phase.steps]
        for _ in range(MAX_ROUNDS):
            num_changes = 0
            for step, s in zip(phase.steps, stats):
                if progress:
                    progress(phase.name, step.pass_.name)
                if s.runs == 0:
                    s.nodes_before = node_count(graph)
                t0 = time.perf_counter()
                num_changes += step.pass_.run(graph, s)
                s.time_s += time.perf_counter() - t0
                s.runs += 1
                s.nodes_after = node_count(graph)
            if num_changes == 0:
                break
        all_stats.extend(stats)
    return PipelineResult(all_stats, nodes_before, node_count(graph), time.perf_counter() - start)
