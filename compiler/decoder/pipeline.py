"""The optimizer pipeline of a decoder build: the standard one, with attention fusion extended by
rules whose output only a paged graph may hold (passes/fuse/attention.py PAGED_RULES: soft-capped
attention as the ONNX Attention op below opset 23; attention_sinks.py: gpt-oss's sinks). canonicalize.py replaces every attention with
infc.PagedAttention before anything runs the graph, so no opset 23 op outlives the build."""

from __future__ import annotations

import dataclasses

from ..passes.engine import RewritePass
from ..passes.fuse import attention, attention_sinks
from ..passes.pipeline import PIPELINE, Phase

ATTENTION_PASS = "fuse_attention"


def _paged(step):
    if step.pass_.name != ATTENTION_PASS:
        return step
    rules = step.pass_.rules + attention.PAGED_RULES + attention_sinks.PAGED_RULES  # tried after the standard ones
    return dataclasses.replace(step, pass_=RewritePass(ATTENTION_PASS, rules))


DECODER_PIPELINE: tuple[Phase, ...] = tuple(
    dataclasses.replace(phase, steps=tuple(_paged(step) for step in phase.steps)) for phase in PIPELINE)
