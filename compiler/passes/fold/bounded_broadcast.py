"""Broadcast outputs whose size onnx's inference loses to a prefix slice of a fixed table.

Learned position embeddings are read as a prefix of a table: `table[:, :seq]` is
Slice(table, 0, Shape(x)[1]) along an axis of static length L, whose size is min(seq, L), a value
onnx cannot name. The next broadcast (x + pos_embedding, or token_type_ids[:, :seq].expand(b, seq))
then gets an unknown dim, and every shape after it is unknown: dynamo exports read all their sizes
off the graph inputs' Shape, so their attention heads (view(b, seq, -1, 64)) and residual norms no
longer prove anything and stay unfused.

Yet broadcast(seq, min(seq, L)) is seq in every run that does not fail: min(seq, L) is seq when
seq <= L; when seq > L it is L, which broadcasts against seq only if L is 1, and then the result is
seq again. So the output of an elementwise broadcast (or Expand) whose dim on one side is a named
size S and on the other is provably min(S, L) or 1 is S. Only that output is named: the slice itself
keeps its unknown size (it is not S when S > L). The caller gives these as value_info and runs onnx's
inference again, as for reshape_ranks.py.
"""

from __future__ import annotations

import onnx

from .reshape_ranks import Dim, _attr, is_named, shape_walk

# ops whose output is the numpy broadcast of all their inputs
BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Where", "Max", "Min", "Equal", "Less", "Greater",
                          "And", "Or", "Mod", "PRelu", "Sum", "Mean"})
# ops whose output has their first input's shape
SAME_SHAPE = frozenset({"Cast", "Identity", "Neg", "Relu", "Not", "Abs", "Sqrt", "Exp", "Erf", "Tanh", "Sigmoid"})


def broadcast_shapes(model: onnx.ModelProto, known: dict[str, list[Dim] | None]) -> dict[str, list[Dim]]:
    """Output name -> dims for broadcasts whose unknown dims this proves (see the module's note);
    `known` (name -> dims onnx inferred) gets them too."""
    shapes = {**{t.name: [int(d) for d in t.dims] for t in model.graph.initializer}, **known}
    producers, found = {}, {}
    for node, values in shape_walk(model, shapes):
        for out in node.output:
            producers[out] = node
        dims = _proven(node, shapes, values, producers)
        if dims is not None:
            found[node.output[0]] = dims
            shapes[node.output[0]] = dims
            known[node.output[0]] = dims
    return found


def _proven(node, shapes, values, producers) -> list[Dim] | None:
    out = shapes.get(node.output[0])
    if node.op_type not in BROADCASTING and node.op_type != "Expand" or out is None:
        return None
    operands = [(name, shapes.get(name)) for name in node.input[:1 if node.op_type == "Expand" else None] if name]
    if node.op_type == "Expand":
        target = values.get(node.input[1]) if len(node.input) > 1 else None
        if target is None:
            return None
        operands.append((None, list(target)))
    if any(dims is None for _, dims in operands):
        return None
    better, rank = list(out), len(out)
    for axis in range(rank):
        if is_named(out[axis]) or isinstance(out[axis], int):
            continue
        sides = [(name, dims[axis - rank + len(dims)]) for name, dims in operands if axis - rank + len(dims) >= 0]
        named = {d for _, d in sides if is_named(d)}
        if len(named) != 1:
            continue
        size = next(iter(named))
        if all(d == size or d == 1 or name is not None and
               _prefix_of(name, axis - rank + len(shapes[name]), size, shapes, values, producers)
               for name, d in sides):
            better[axis] = size
    return better if better != list(out) else None


def _prefix_of(name: str, axis: int, size: str, shapes, values, producers, depth: int = 0) -> bool:
    """Tensor `name`'s dim at `axis` is provably 1, `size` or min(size, L) for a static L: each of
    them broadcasts against `size` to `size`."""
    dims = shapes.get(name)
    if dims is None or not 0 <= axis < len(dims) or depth > 16:
        return False
    if dims[axis] in (size, 1):
        return True
    node = producers.get(name)
    if node is None:
        return False
    ins = node.input
    if node.op_type in SAME_SHAPE:
        return _prefix_of(ins[0], axis, size, shapes, values, producers, depth + 1)
    if node.op_type == "GatherElements":  # the output has the indices' shape
        return _prefix_of(ins[1], axis, size, shapes, values, producers, depth + 1)
    if node.op_type == "Gather":  # data dims before the axis, then the indices' dims, then data's rest
        data, indices = shapes.get(ins[0]), shapes.get(ins[1])
        if data is None or indices is None:
            return False
        at = _attr(node, "axis", 0) % len(data)
        if axis < at:
            return _prefix_of(ins[0], axis, size, shapes, values, producers, depth + 1)
        if axis < at + len(indices):
            return _prefix_of(ins[1], axis - at, size, shapes, values, producers, depth + 1)
        return _prefix_of(ins[0], axis - len(indices) + 1, size, shapes, values, producers, depth + 1)
    if node.op_type == "Slice":
        return (_is_prefix_slice(node, axis, size, shapes, values) if _slices(node, axis, shapes, values)
                else _prefix_of(ins[0], axis, size, shapes, values, producers, depth + 1))
    return False


def _slice_axes(node, shapes, values) -> list[int] | None:
    data, starts = shapes.get(node.input[0]), values.get(node.input[1]) if len(node.input) > 2 else None
    if data is None or starts is None:
        return None
    axes = values.get(node.input[3]) if len(node.input) > 3 and node.input[3] else list(range(len(starts)))
    if axes is None or not all(isinstance(a, int) for a in axes):
        return None
    return [a % len(data) for a in axes]


def _slices(node, axis: int, shapes, values) -> bool:
    """The Slice may cut `axis` (True where its axes are not known)."""
    axes = _slice_axes(node, shapes, values)
    return axes is None or axis in axes


def _is_prefix_slice(node, axis: int, size: str, shapes, values) -> bool:
    """Slice(data, [0], [size], [axis], [1]) with data's dim there static: its size is min(size, L)."""
    axes = _slice_axes(node, shapes, values)
    if axes is None or axis not in axes:
        return False
    data, starts, ends = shapes.get(node.input[0]), values.get(node.input[1]), values.get(node.input[2])
    steps = values.get(node.input[4]) if len(node.input) > 4 and node.input[4] else None
    if ends is None or not len(starts) == len(ends) == len(axes):
        return False
    i = axes.index(axis)
    step = steps[i] if steps is not None and i < len(steps) else 1
    return starts[i] == 0 and step == 1 and ends[i] == size and isinstance(data[axis], int)
