"""Reshape output shapes that onnx's inference leaves unknown, so the values after them keep a rank.

onnx infers Reshape from a computed target shape only from opset 14 on (by data propagation); at
opset 13 and below it gives up, not even a rank, and everything downstream loses its shape: a
GroupNorm exported at opset 13 (Reshape -> InstanceNormalization -> Reshape(x, Shape(x))) leaves
the whole encoder after it rankless, and the LayerNorm, GEMM and attention fusions all decline.

This walks the graph once, evaluating shape tensors symbolically (Shape, Gather, Slice, Concat,
Unsqueeze, Squeeze, Cast, Identity, constants, arithmetic, Equal and Where: the exporters' shape
chains, TorchScript's expand included), and gives each Reshape
output without a shape the target's dims (0 copies the input dim, -1 is solved when the rest is
known) or, when only the target's length is known, that rank with unknown dims. The caller adds
these as value_info and runs onnx's inference again, which takes them as given.
"""

from __future__ import annotations

import math

import onnx
from onnx import numpy_helper

from .dim_forms import Dim, is_named, symbolic_arithmetic


def reshape_shapes(model: onnx.ModelProto, shapes: dict[str, list[Dim] | None],
                   given: frozenset[str] = frozenset()) -> dict[str, list[Dim]]:
    """Output name -> dims for Reshape outputs of the main graph where this walk knows more than
    `shapes` (name -> dims of every value onnx's inference knows, None for an unknown rank): a rank
    onnx left unknown, or a size it left symbolic (x.view(batch, seq, -1, 64) at any opset: onnx
    cannot divide a symbolic batch, the names cancel here). `given`: what earlier rounds gave."""
    found = {}
    for node, values in shape_walk(model, shapes):
        out = node.output[0]
        if node.op_type == "Reshape" and len(node.input) > 1:
            dims = _target(node, values, shapes)
            if dims is not None and _information(dims) > _information(shapes.get(out)):
                found[out] = dims
                shapes[out] = dims
    return found


def shape_walk(model: onnx.ModelProto, shapes: dict[str, list[Dim] | None]):
    """Each ONNX-domain node of the main graph in order, with the symbolic values of the shape tensors
    computed up to and including it (one dict, growing). `shapes` is read as it is at each node, so a
    caller may add what it proves on the way."""
    values = initial_values(model)
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or not node.output:
            continue
        value = _evaluate(node, values, shapes)
        if value is not None:
            values[node.output[0]] = value
        yield node, values


def initial_values(model: onnx.ModelProto) -> dict[str, list[Dim]]:
    """The int64 initializers of rank <= 1 as shape values (the walks' starting point)."""
    values = {t.name: _ints(numpy_helper.to_array(t)) for t in model.graph.initializer
              if t.data_type == onnx.TensorProto.INT64 and len(t.dims) <= 1}
    return {k: v for k, v in values.items() if v is not None}


def _information(dims: list[Dim] | None) -> tuple[int, int, int]:
    """Known rank, sizes, then named dims: an earlier round's shape is replaced only by a better one
    (onnx names unknown dims afresh, unk__N, on every run: comparing names would never settle)."""
    if dims is None:
        return (0, 0, 0)
    return (1, sum(isinstance(d, int) for d in dims), sum(is_named(d) for d in dims))




def _ints(array) -> list[Dim] | None:
    if array.ndim > 1 or array.dtype.kind not in "iu":
        return None
    return [int(v) for v in array.reshape(-1)]


def _attr(node: onnx.NodeProto, name: str, default=None):
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default


def _evaluate(node: onnx.NodeProto, values: dict, shapes: dict) -> list[Dim] | None:
    """The symbolic value of a 1-D (or scalar, as a 1-list) int64 shape tensor `node` computes."""
    op, inputs = node.op_type, [values.get(name) if name else None for name in node.input]
    if op == "Shape":
        dims = shapes.get(node.input[0])
        if dims is None:
            return None
        start, end = _attr(node, "start", 0), _attr(node, "end", None)
        return list(dims[start:end])
    if op == "Constant":
        tensor = _attr(node, "value")
        return _ints(numpy_helper.to_array(tensor)) if isinstance(tensor, onnx.TensorProto) else None
    if op in ("Identity", "Cast", "Squeeze") and inputs[0] is not None:
        return inputs[0] if op != "Cast" or _attr(node, "to") in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) \
            else None
    if op == "Unsqueeze" and inputs[0] is not None and len(inputs[0]) == 1:
        return inputs[0]
    if op == "Reshape" and inputs[0] is not None and len(inputs[0]) == 1 and inputs[1] in ([-1], [1]):
        return inputs[0]  # dynamo's way to make a scalar size one element
    if op == "Concat" and inputs and all(v is not None for v in inputs):
        return [d for v in inputs for d in v]
    if op == "Gather" and inputs[0] is not None and inputs[1] is not None and _attr(node, "axis", 0) == 0:
        size = len(inputs[0])
        picked = [inputs[0][i] if -size <= i < size else None for i in inputs[1] if isinstance(i, int)]
        return picked if len(picked) == len(inputs[1]) else None
    if op == "Slice" and inputs[0] is not None:
        return _slice(node, inputs)
    if op in _ARITHMETIC and len(inputs) == 2 and inputs[0] is not None and inputs[1] is not None:
        return _arithmetic(op, inputs[0], inputs[1])
    if op == "Equal" and len(inputs) == 2 and inputs[0] is not None and inputs[1] is not None:
        return _elementwise(_equal, inputs[0], inputs[1])
    if op == "Where" and len(inputs) == 3 and all(v is not None for v in inputs):
        picked = _elementwise(lambda c, a: (c, a), inputs[0], inputs[1])
        return _elementwise(lambda ca, b: None if not isinstance(ca[0], int) else ca[1] if ca[0] else b,
                            picked, inputs[2]) if picked is not None else None
    return None


def _equal(a: Dim, b: Dim) -> int | None:
    """1 / 0 for sizes known equal / unequal; a named size is never negative (TorchScript's expand
    asks Equal(shape, -1) before its Where)."""
    if isinstance(a, int) and isinstance(b, int):
        return int(a == b)
    if is_named(a) and is_named(b) and a == b:
        return 1
    return 0 if is_named(a) and isinstance(b, int) and b < 0 or is_named(b) and isinstance(a, int) and a < 0 else None


def _elementwise(fn, a: list, b: list) -> list | None:
    if len(a) != len(b) and 1 not in (len(a), len(b)):
        return None
    count = max(len(a), len(b))
    return [fn(x, y) for x, y in zip(a * count if len(a) == 1 else a, b * count if len(b) == 1 else b)]


# Shape arithmetic (Swin's H // window): int64 Div truncates toward zero, sizes are >= 0
_ARITHMETIC = {"Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
               "Div": lambda a, b: a // b if b else None}


def _arithmetic(op: str, a: list[Dim], b: list[Dim]) -> list[Dim] | None:
    fn = _ARITHMETIC[op]
    if len(a) != len(b) and 1 not in (len(a), len(b)):
        return None
    count = max(len(a), len(b))
    a, b = a * count if len(a) == 1 else a, b * count if len(b) == 1 else b
    return [fn(x, y) if isinstance(x, int) and isinstance(y, int) else symbolic_arithmetic(op, x, y)
            for x, y in zip(a, b)]


def _slice(node: onnx.NodeProto, inputs: list) -> list[Dim] | None:
    if len(node.input) >= 3:  # opset 10+: starts, ends, axes, steps as inputs
        starts, ends = inputs[1], inputs[2]
        axes = inputs[3] if len(inputs) > 3 and node.input[3] else [0]
        steps = inputs[4] if len(inputs) > 4 and node.input[4] else [1]
    else:
        starts, ends, axes, steps = _attr(node, "starts"), _attr(node, "ends"), _attr(node, "axes", [0]), [1]
    if starts is None or ends is None or axes is None or steps is None or list(axes) not in ([0], [-1]) or \
            len(starts) != 1 or len(ends) != 1 or not all(isinstance(v, int) for v in (*starts, *ends, *steps)):
        return None
    return inputs[0][slice(starts[0], ends[0], steps[0])]


def _target(node: onnx.NodeProto, values: dict, shapes: dict) -> list[Dim] | None:
    target = values.get(node.input[1])
    if target is None:
        length = shapes.get(node.input[1])
        return [None] * length[0] if length is not None and len(length) == 1 and isinstance(length[0], int) else None
    source = shapes.get(node.input[0])
    allow_zero = _attr(node, "allowzero", 0)
    dims: list[Dim] = []
    for axis, dim in enumerate(target):
        if dim == 0 and not allow_zero:
            dims.append(source[axis] if source is not None and axis < len(source) else None)
        elif isinstance(dim, int) and dim < 0:
            dims.append(-1)
        else:
            dims.append(dim)
    if -1 in dims:
        solved = _solve(source, [d for d in dims if d != -1]) if dims.count(-1) == 1 else None
        dims = [solved if d == -1 else d for d in dims]
    return dims


def _solve(source: list[Dim] | None, rest: list[Dim]) -> int | None:
    """The -1 of a reshape: the source's size over the rest's, symbolic dims cancelling by name
    ([batch, seq, 32] -> [batch, seq, -1, 8] gives 4)."""
    if source is None:
        return None
    left, right = list(source), list(rest)
    for dim in rest:
        if isinstance(dim, str) and dim in left:
            left.remove(dim)
            right.remove(dim)
    if not all(isinstance(d, int) for d in right) or math.prod(right) <= 0:
        return None
    names = [d for d in left if not isinstance(d, int)]
    sizes = math.prod(d for d in left if isinstance(d, int))
    if len(names) == 1 and isinstance(names[0], str) and sizes == math.prod(right):  # x.view(-1, seq): batch
        return names[0]
    if names:
        return None
    return sizes // math.prod(right) if sizes % math.prod(right) == 0 else None
