"""Slice outputs whose symbolic dims onnx's inference copies from the input when the slice is not
the whole axis.

onnx types `x[:, 0:0]` of a dim named 'n' as 'n' again (opset 10+ Slice with constant starts and
ends, fuzz_graphs --forms old seed 983). Written into the optimized model, that claims the empty
slice is as long as its input: onnxruntime's planner then shares one buffer between values the
names say are equal and fails ("Shape mismatch attempting to re-use buffer. {1,0} != {1,144}").
A sliced axis keeps its input's symbol only when the slice provably takes all of it; otherwise
its length is unknown here (None), never the input's name.
"""

from __future__ import annotations

import onnx
from onnx import numpy_helper

WHOLE_END = 2**31 - 1  # exporters write INT_MAX or INT64_MAX for "to the end"


def _constants(graph: onnx.GraphProto) -> dict[str, list[int]]:
    """The graph's small integer constants (initializers and Constant nodes) as lists."""
    found = {}
    for tensor in graph.initializer:
        if tensor.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and len(tensor.dims) <= 1:
            found[tensor.name] = [int(v) for v in numpy_helper.to_array(tensor).reshape(-1)]
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            tensor = node.attribute[0].t
            if tensor.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and len(tensor.dims) <= 1:
                found[node.output[0]] = [int(v) for v in numpy_helper.to_array(tensor).reshape(-1)]
    return found


def _slice_arguments(node: onnx.NodeProto, constants: dict[str, list[int]]):
    """(starts, ends, axes or None, steps) when all are constant, else None."""
    if len(node.input) == 1:  # Slice-1: attributes
        attrs = {a.name: list(a.ints) for a in node.attribute}
        if "starts" not in attrs or "ends" not in attrs:
            return None
        return attrs["starts"], attrs["ends"], attrs.get("axes"), [1] * len(attrs["starts"])
    names = list(node.input[1:]) + [""] * (5 - len(node.input))
    starts, ends = constants.get(names[0]), constants.get(names[1])
    axes = constants.get(names[2]) if names[2] else None
    steps = constants.get(names[3]) if names[3] else None
    if starts is None or ends is None or (names[2] and axes is None) or (names[3] and steps is None):
        return None
    return starts, ends, axes, steps or [1] * len(starts)


def _takes_whole_axis(start: int, end: int, step: int) -> bool:
    """Every element, forwards or reversed (`x[::-1]` keeps the length too)."""
    if step == 1:
        return (start == 0 or start <= -WHOLE_END) and end >= WHOLE_END
    if step == -1:
        return (start == -1 or start >= WHOLE_END) and end <= -WHOLE_END
    return False


def correct_slice_dims(graph: onnx.GraphProto, dims_of: dict[str, tuple], input_dims: dict[str, list | None]) -> None:
    """In `dims_of` (name -> (elem_type, dims), as shape_inference collects them for one graph),
    forget a Slice output's symbolic dim where it repeats the input's on an axis not taken whole."""
    constants = None
    for node in graph.node:
        if node.op_type != "Slice" or not node.output or node.output[0] not in dims_of:
            continue
        elem_type, dims = dims_of[node.output[0]]
        source = input_dims.get(node.input[0])
        if dims is None or source is None or len(source) != len(dims):
            continue
        constants = _constants(graph) if constants is None else constants
        arguments = _slice_arguments(node, constants)
        if arguments is None:
            continue
        starts, ends, axes, steps = arguments
        axes = list(range(len(starts))) if axes is None else [a + len(dims) if a < 0 else a for a in axes]
        corrected = list(dims)
        for axis, start, end, step in zip(axes, starts, ends, steps):
            if 0 <= axis < len(dims) and isinstance(source[axis], str) and dims[axis] == source[axis] \
                    and not _takes_whole_axis(start, end, step):
                corrected[axis] = None
        if corrected != list(dims):
            dims_of[node.output[0]] = (elem_type, corrected)
