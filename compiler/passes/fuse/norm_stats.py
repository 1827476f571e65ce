"""Shared reading of written-out normalizations (LayerNorm, RMSNorm): which axes they reduce, the
epsilon, and the forms of "divide by the standard deviation" exporters write."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...graph import const_value, is_float, is_scalar_const
from ..engine import Match
from ..pattern import const, op


def divided_by(numer, std):
    return (op.Div(numer, std, name="norm"), op.Mul(numer, op.Reciprocal(std), name="norm"),
            op.Mul(numer, op.Div(const("one"), std), name="norm"))


def _suffix_axis(node: gs.Node, rank: int | None) -> int | None:
    """ReduceMean axes (attribute before opset 18, input after) as one LayerNorm-style axis < 0;
    GlobalAveragePool averages every dim after the second."""
    if node.op == "GlobalAveragePool":
        return 2 - rank if rank is not None and rank >= 3 else None
    axes = node.attrs.get("axes", const_value(node.inputs[1]) if len(node.inputs) > 1 else None)
    if node.attrs.get("keepdims", 1) != 1 or (axes is None and (len(node.inputs) > 1 or rank is None
                                                                 or node.attrs.get("noop_with_empty_axes", 0))):
        return None
    axes = sorted(a - rank if a >= 0 and rank else a for a in (range(rank) if axes is None else np.ravel(axes)))
    return axes[0] if axes == list(range(-len(axes), 0)) else None


def norm_params(m: Match, reduce_names: tuple[str, ...]):
    """(axis, epsilon, normalized dims) of a written-out norm, or a reason to decline."""
    shape = m["x"].shape
    axes = {_suffix_axis(m.node(n), len(shape) if shape is not None else None) for n in reduce_names}
    if not is_float(m["x"]) or shape is None:
        return "input is not floating point or its rank is unknown"
    if len(axes) != 1 or None in axes or -min(axes) > len(shape):
        return "reduced axes are not the same last dims"
    dims = shape[min(axes):]
    if not all(isinstance(d, int) for d in dims):
        return "normalized dims are not static"
    eps = const_value(m["eps"])
    if eps.size != 1 or not 0 <= float(eps.ravel()[0]) < 1 or ("two" in m.values and not is_scalar_const(m["two"], 2.0, 0)):
        return "not a mean of squares plus a small epsilon"
    if "one" in m.values and not is_scalar_const(m["one"], 1.0, 0):
        return "numerator constant is not 1"
    return min(axes), float(eps.ravel()[0]), tuple(dims)
