"""Building the replacement nodes of the attention and rotary fusions: a node builder with runtime
dims, layout changes that read through the Transpose producing a tensor, and static dims."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import opset_of
from ..engine import Match


class Builder:
    """Collects a rewrite's new nodes; each call adds one node and returns its (first) output."""

    def __init__(self, m: Match):
        self.m, self.nodes, self.opset = m, [], opset_of(m.graph)

    def __call__(self, op: str, *inputs, out=None, dtype=None, shape=None, domain=None, **attrs) -> gs.Tensor:
        out = out if out is not None else self.m.value(op.lower(), dtype=dtype, shape=shape)
        inputs = [gs.Variable.empty() if t is None else t for t in inputs]
        self.nodes.append(gs.Node(op, attrs=attrs, inputs=inputs, outputs=[out], domain=domain))
        return out

    def const(self, values, dtype=np.int64) -> gs.Constant:
        return self.m.constant("c", np.asarray(values, dtype=dtype))

    def dims(self, t: gs.Tensor, axes: list[int]) -> gs.Tensor:
        """The 1-D int64 tensor of `t`'s runtime dims at `axes`."""
        if self.opset >= 15 and axes == list(range(axes[0], axes[-1] + 1)):
            return self("Shape", t, dtype=np.int64, shape=[len(axes)], start=axes[0], end=axes[-1] + 1)
        shape = self("Shape", t, dtype=np.int64)
        return self("Gather", shape, self.const(axes), dtype=np.int64, shape=[len(axes)], axis=0)


def same_dim(a, b) -> bool:
    """Provably equal dims: equal ints, or one dim_param (in ONNX one name is one size)."""
    return a is not None and a == b and not (isinstance(a, (int, np.integer)) and a < 0)


def shape_of(t: gs.Tensor, rank: int) -> list | None:
    return list(t.shape) if t.shape is not None and len(t.shape) == rank else None


def producer(t: gs.Tensor) -> gs.Node | None:
    return t.inputs[0] if len(t.inputs) == 1 else None


def transposed(b: Builder, t: gs.Tensor, perm: list[int]) -> gs.Tensor:
    """Transpose(t, perm), composed with a Transpose that produces `t`; no node when they cancel."""
    node = producer(t)
    if node is not None and node.op == "Transpose" and node.attrs.get("perm") is not None:
        t, perm = node.inputs[0], [list(node.attrs["perm"])[i] for i in perm]
    if perm == list(range(len(perm))):
        return t
    shape = [t.shape[i] for i in perm] if t.shape is not None and len(t.shape) == len(perm) else None
    return b("Transpose", t, dtype=t.dtype, shape=shape, perm=perm)
