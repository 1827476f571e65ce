"""The graph a seed grows: values with their shapes at batch 1 and the axes that vary with the profile."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from onnx import helper

F32 = np.float32
LATE = "fuzz.late"  # ops newer than the opset the graph is written in; moved to the default domain at the end


@dataclass
class Graph:
    rng: np.random.Generator
    nodes: list = field(default_factory=list)
    inits: dict = field(default_factory=dict)
    shapes: dict = field(default_factory=dict)  # value -> shape at batch 1 (dim 0 is the batch)
    dyn: dict = field(default_factory=dict)  # value -> its axes (besides the batch) that vary with the profile
    count: int = 0
    mask_length: int | None = None  # an attention mask input [batch, length] the graph may take
    mask_varies: bool = False
    mask_used: bool = False
    ids_used: bool = False  # token ids [batch, length] beside the mask
    # how the seed is judged: "quantized" (a Q/DQ rounding may flip on a 1-ulp difference before it),
    # "fp16" (values rounded to float16), "late" (ops of opset 23 written in the placeholder domain LATE)
    flags: set = field(default_factory=set)
    extra_outputs: list = field(default_factory=list)  # (name, dims) of outputs off the batch-first walk
    # (name, element type, shape, varying axes) of values not in float32, exposed as outputs
    typed_outputs: list = field(default_factory=list)

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def const(self, array, stem: str = "c") -> str:
        name = self.name(stem)
        self.inits[name] = np.asarray(array)
        return name

    def weight(self, *shape, scale: float | None = None) -> str:
        scale = scale if scale is not None else 1.0 / np.sqrt(max(1, shape[0]))
        return self.const((self.rng.standard_normal(shape) * scale).astype(F32), "w")

    def node(self, op: str, inputs: list[str], shape: tuple, dyn=None, **attrs) -> str:
        """`dyn`: the output's varying axes; by default its first input's, where ranks agree."""
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        self.shapes[out] = tuple(shape)
        if dyn is None:
            source = next((i for i in inputs if i in self.shapes), None)
            dyn = self.dyn.get(source, frozenset()) if source and len(self.shapes[source]) == len(shape) else frozenset()
        self.dyn[out] = frozenset(dyn)
        return out

    def shape_node(self, op: str, inputs: list[str], **attrs) -> str:
        """A node of the shape arithmetic: integers, not a value for the float ops to take."""
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def fixed(self, x: str, *axes: int) -> bool:
        """None of `axes` of x varies: a constant may be shaped by them."""
        rank = len(self.shapes[x])
        return not any(a % rank in self.dyn.get(x, ()) for a in axes)
