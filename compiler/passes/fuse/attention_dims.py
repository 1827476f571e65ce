"""Shape tensors read back as dims: which entries of a Reshape's shape input are constants and which
are provably a runtime dim of some tensor, whichever way the exporter computed them:

    Unsqueeze(Gather(Shape(t), i))          TorchScript
    Unsqueeze(Squeeze(Shape(t, i, i + 1)))  dynamo's sym_size (or Reshape(.., [-1]) for the Unsqueeze)
    Shape(t, start, end), Slice(Shape(t), a, b)    several dims at once (dynamo)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import const_value
from .attention_builder import producer, shape_of


@dataclass(frozen=True, eq=False)
class DimOf:
    """The runtime size of `tensor` along `axis` (non-negative)."""

    tensor: gs.Tensor
    axis: int


def _shape_dims(node: gs.Node | None, start=None, end=None) -> list[DimOf] | None:
    """The dims a Shape node gives, optionally sliced again by [start:end]; None when its input's rank
    is not known."""
    if node is None or node.op != "Shape" or node.inputs[0].shape is None:
        return None
    t, rank = node.inputs[0], len(node.inputs[0].shape)
    dims = [DimOf(t, axis) for axis in range(rank)][slice(node.attrs.get("start", 0), node.attrs.get("end", rank))]
    return dims[slice(start, end)]


def _slice_of_shape(node: gs.Node) -> list[DimOf] | None:
    values = [const_value(t) for t in node.inputs[1:]]
    if len(values) < 2 or any(v is None or v.size != 1 for v in values):
        return None
    start, end, *rest = (int(v.reshape(-1)[0]) for v in values)
    if rest and rest[0] != 0 or len(rest) > 1 and rest[1] != 1:  # axis 0, step 1
        return None
    return _shape_dims(producer(node.inputs[0]), start, end)


def scalar_dim(s: gs.Tensor) -> DimOf | None:
    """The dim a scalar tensor is: Gather(Shape(t), i), Squeeze(Shape(t, i, i + 1)) or
    Squeeze(Slice(Shape(t), i, i + 1)) (TorchScript's size(-2))."""
    node = producer(s)
    if node is not None and node.op == "Gather" and node.attrs.get("axis", 0) == 0:
        index, dims = const_value(node.inputs[1]), _shape_dims(producer(node.inputs[0]))
        if index is not None and index.size == 1 and dims is not None and -len(dims) <= int(index) < len(dims):
            return dims[int(index)]
    if node is not None and node.op == "Squeeze":
        inner = producer(node.inputs[0])
        dims = _slice_of_shape(inner) if inner is not None and inner.op == "Slice" else _shape_dims(inner)
        return dims[0] if dims is not None and len(dims) == 1 else None
    return None


def _is_to_one_element(node: gs.Node) -> bool:
    """Reshape(scalar, [-1] or [1]): dynamo's way to Unsqueeze a dim before a Concat."""
    target = const_value(node.inputs[1]) if node.op == "Reshape" else None
    return target is not None and target.size == 1 and int(target.reshape(-1)[0]) in (-1, 1)


def shape_elements(t: gs.Tensor) -> list:
    """A 1-D shape tensor as ints (constants), DimOf (provably a dim) and other scalar tensors;
    [] when that is not known."""
    if const_value(t) is not None:
        return [int(v) for v in np.ravel(const_value(t))]
    node, out = producer(t), []
    if node is not None and node.op == "Shape":
        return _shape_dims(node) or []
    for part in node.inputs if node is not None and node.op == "Concat" else []:
        inner = producer(part)
        if const_value(part) is not None:
            out += [int(v) for v in np.ravel(const_value(part))]
        elif inner is not None and (inner.op == "Unsqueeze" or _is_to_one_element(inner)) \
                and shape_of(inner.inputs[0], 0) is not None:
            out.append(scalar_dim(inner.inputs[0]) or inner.inputs[0])
        elif inner is not None and inner.op in ("Shape", "Slice"):
            dims = _shape_dims(inner) if inner.op == "Shape" else _slice_of_shape(inner)
            if dims is None:
                return []
            out += dims
        else:
            return []
    return out


def is_dim_of(e, t: gs.Tensor, axis: int) -> bool:
    """Entry `e` of shape_elements is `t`'s runtime dim at `axis`."""
    return isinstance(e, DimOf) and e.tensor is t and e.axis == axis
