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
from .expand import embed_layernorm, packed_attention
from .fold import batchnorm, conv_affine, pad_into_conv
from .fold.constant_folding import FoldConstants
from .fold.shape_inference import InferShapes
from .fuse.attention_miss import ExplainUnfusedAttention
from .fuse import (
    attention,
    attention_seq_first,
    bias_gelu,
    conv_activation,
    conv_residual,
    gelu,
    gemm,
    hardswish,
    layernorm,
    merged_heads,
    rmsnorm,
    rotary,
    score_bias,
    silu,
    skip_layernorm,
    swiglu,
)
from .layout import pretranspose_weights, transpose_cancel, transpose_into_matmul
from .stats import PassStats

MAX_ROUNDS = 8
EXPAND_ATTENTION, EXPAND_EMBEDDING = "expand_packed_attention", "expand_embed_layernorm"


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
        Step(RewritePass(EXPAND_ATTENTION, packed_attention.RULES), "other tools' packed (Q)Attention into a GEMM and MultiHeadAttention, which infc has kernels for; needs shapes (a 1-D mask must be provably [batch]) and comes before the embedding expansion, whose mask index it recognizes"),
        Step(RewritePass(EXPAND_EMBEDDING, embed_layernorm.RULES), "other tools' (Q)EmbedLayerNormalization into Gather/Add/LayerNormalization, which infc has kernels for; before folding, which turns dequantized tables into float ones"),
        Step(FoldConstants(), "turns static Shape chains and constant arithmetic into constants"),
        Step(CommonSubexpressions(), "exporters repeat shape computations; merged, they fold and match once"),
        Step(RewritePass("fold_batchnorm", batchnorm.RULES), "BN into its Conv before Conv epilogue fusions look at the Conv"),
        Step(RewritePass("fold_conv_affine", conv_affine.RULES), "per-channel Add/Mul into Conv bias and weights, also after BN folding"),
        Step(RewritePass("fold_pad_into_conv", pad_into_conv.RULES), "an explicit zero Pad ('same' padding ports) is a copy the Conv's pads avoid"),
        Step(RemoveNoOps(), "folding exposes reshapes to the same shape and neutral arithmetic"),
        Step(RemoveDeadCode(), "folded subgraphs leave dead nodes and initializers"),
    )),
    Phase("fuse", (
        Step(RewritePass("fuse_hardswish", hardswish.RULES), "decomposed HardSwish first, so Conv epilogues see one op"),
        Step(RewritePass("fuse_gelu", gelu.RULES), "erf/tanh GELU forms into one op before bias and GEMM epilogues look for it"),
        Step(RewritePass("fuse_silu", silu.RULES), "x*sigmoid(x) into one op; SwiGLU and Conv epilogues build on it"),
        Step(RewritePass("fuse_layernorm", layernorm.RULES), "before the residual-Add fusion, which matches on LayerNormalization"),
        Step(RewritePass("fuse_rmsnorm", rmsnorm.RULES), "before the residual-Add fusion, which matches on the RMSNorm op"),
        Step(RewritePass("fuse_skip_layernorm", skip_layernorm.RULES), "residual Add + norm, once both norm forms exist"),
        Step(RewritePass("fuse_rotary", rotary.RULES), "RoPE before attention, whose Q/K inputs it feeds"),
        Step(RewritePass("unmerge_heads_scores", merged_heads.SCORES), "Q·Kᵀ over (B*N) views (Bloom) made 4-D, the form attention fusion matches"),
        Step(RewritePass("unmerge_heads_context", merged_heads.CONTEXT), "then P·V over (B*N) views, proven against those 4-D scores"),
        Step(RewritePass("xsoftmax", score_bias.ZEROED), "DeBERTa's XSoftmax (probabilities zeroed where masked) as the NaN-guarded Softmax attention takes, before score_bias turns its masked_fill around"),
        Step(RewritePass("score_bias", score_bias.RULES), "a position bias (ALiBi) beside the mask joins it, so attention fuses with one bias"),
        Step(RewritePass("fuse_attention", attention.RULES), "before GEMM fusion so Q/K/V projections stay visible to the matcher"),
        Step(RewritePass("fuse_attention_seq_first", attention_seq_first.RULES), "torch's need_weights attention over sequence-first (B*N) views; also before GEMM fusion"),
        Step(ExplainUnfusedAttention(), "says why a Softmax of Q·Kᵀ left unfused matched no attention rule at all"),
        Step(RewritePass("fuse_swiglu", swiglu.RULES), "gate/up pair after SiLU fusion and before GEMM epilogues take the MatMuls"),
        Step(RewritePass("fuse_bias_gelu", bias_gelu.RULES), "bias Add into GELU before the GEMM fusion would take the Add"),
        Step(RewritePass("fuse_gemm", gemm.RULES), "MatMul + bias (+ activation) into a GEMM with epilogue"),
        Step(RewritePass("fuse_conv_residual", conv_residual.RULES), "a residual Add (and the activation after it) into FusedConv's Z, before the activation alone would take the Conv"),
        Step(RewritePass("fuse_conv_activation", conv_activation.RULES), "last: Conv takes its activation once bias/BN are folded"),
    )),
    Phase("layout", (
        Step(RewritePass("cancel_transposes", transpose_cancel.RULES), "inverse pairs vanish and chains merge before folding into GEMMs"),
        Step(RemoveNoOps(), "cancelled Transpose pairs leave Identity nodes to bypass"),
        Step(RewritePass("transpose_into_matmul", transpose_into_matmul.RULES), "a Transpose feeding a MatMul/Gemm becomes a trans flag"),
        Step(RewritePass("pretranspose_weights", pretranspose_weights.RULES), "constant weights stored in the order the GEMM reads them"),
        Step(RemoveDeadCode(), "transposed weights leave the originals unused"),
    )),
    Phase("final", (
        Step(CommonSubexpressions(), "fusions can create equal nodes (e.g. one Transpose of a shared weight)"),
        Step(RemoveDeadCode(), "leave nothing unused in the written model"),
    )),
)


# `infc optimize` writes a model for onnxruntime, whose packed contrib kernels beat their expansion
# (BERT from its transformers optimizer: 1.10-1.13x slower expanded): the expansion is for builds.
PORTABLE_PIPELINE: tuple[Phase, ...] = tuple(
    Phase(phase.name, tuple(step for step in phase.steps if step.pass_.name not in (EXPAND_ATTENTION, EXPAND_EMBEDDING)))
    for phase in PIPELINE)


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
                before = node_count(graph)
                if s.runs == 0:
                    s.nodes_before = s.nodes_after = before
                t0 = time.perf_counter()
                num_changes += step.pass_.run(graph, s)
                s.time_s += time.perf_counter() - t0
                s.runs += 1
                s.nodes_after += node_count(graph) - before  # only this pass's own change, over all rounds
            if num_changes == 0:
                break
        all_stats.extend(stats)
    return PipelineResult(all_stats, nodes_before, node_count(graph), time.perf_counter() - start)
