"""Nodes that read only metadata fold to constants: Shape, Size and Shape->Gather/Slice chains when
the dims they read are static, and CastLike of a constant to a value whose dtype is known (the
dynamo exporter writes `CastLike(0.0, x)` for every default bias and Clip bound)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import const_value
from ..stats import PassStats


def _static(dim) -> bool:
    return isinstance(dim, (int, np.integer)) and dim >= 0


def _shape_of(node: gs.Node) -> list | None:
    shape = node.inputs[0].shape
    if shape is None:
        return None
    rank = len(shape)
    start = node.attrs.get("start", 0)
    end = node.attrs.get("end", rank)
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = max(0, min(rank, end + rank if end < 0 else end))
    return list(shape[start:end])


def _replace_with_constant(node: gs.Node, value: np.ndarray) -> None:
    out = node.outputs[0]
    node.inputs.clear()
    node.outputs.clear()
    out.to_constant(value)


def fold_shape_node(node: gs.Node, stats: PassStats) -> bool:
    """Folds `node` in place when it reads only static dims; returns whether it did."""
    if node.op == "Shape" and node.inputs:
        dims = _shape_of(node)
        if dims is not None and all(_static(d) for d in dims):
            _replace_with_constant(node, np.array(dims, dtype=np.int64))
            stats.record_match("fold_static_shape")
            return True
    elif node.op == "Size" and node.inputs:
        shape = node.inputs[0].shape
        if shape is not None and all(_static(d) for d in shape):
            _replace_with_constant(node, np.array(int(np.prod(shape)), dtype=np.int64))
            stats.record_match("fold_static_size")
            return True
    elif node.op == "CastLike" and len(node.inputs) == 2 and isinstance(node.inputs[0], gs.Constant) and node.inputs[1].dtype is not None:
        _replace_with_constant(node, np.asarray(node.inputs[0].values).astype(node.inputs[1].dtype))
        stats.record_match("fold_castlike_of_constant")
        return True
    elif node.op == "Gather" and len(node.inputs) == 2 and _is_shape_output(node.inputs[0]):
        dims = _shape_of(node.inputs[0].inputs[0])
        indices = const_value(node.inputs[1])
        if dims is not None and indices is not None and node.attrs.get("axis", 0) == 0:
            picked = [dims[int(i)] for i in np.ravel(indices)]
            if all(_static(d) for d in picked):
                _replace_with_constant(node, np.array(picked, dtype=np.int64).reshape(indices.shape))
                stats.record_match("fold_static_shape_gather")
                return True
    elif node.op == "Slice" and len(node.inputs) >= 3 and _is_shape_output(node.inputs[0]):
        dims = _shape_of(node.inputs[0].inputs[0])
        params = [const_value(t) for t in node.inputs[1:]]
        if dims is not None and all(p is not None for p in params):
            starts, ends = int(params[0][0]), int(params[1][0])
            step = int(params[3][0]) if len(params) > 3 else 1
            picked = dims[slice(starts, ends, step)] if len(params) < 3 or int(np.ravel(params[2])[0]) == 0 else None
            if picked is not None and all(_static(d) for d in picked):
                _replace_with_constant(node, np.array(picked, dtype=np.int64))
                stats.record_match("fold_static_shape_slice")
                return True
    return False


def _is_shape_output(tensor: gs.Tensor) -> bool:
    return len(tensor.inputs) == 1 and tensor.inputs[0].op == "Shape"
