"""Lengths after convolutions and trims, as names onnx can carry: `len//20-1`.

A convolutional front end (wav2vec2, HuBERT: strides 5, 2, 2 over raw samples) gives lengths that
onnx's inference leaves unknown, while a dynamo export computes the same length for its Reshapes
from the input's Shape, already simplified by torch (`len // 20 - 1`). Nothing links the two, so the
head count of view(b, len', -1, 64) and every fusion after it is lost.

Such lengths are kept here in one canonical form, base // q + c (base a named dim, q >= 1), which
is closed under what both sides do (dim_forms.py). The shape walk (reshape_ranks.py) computes the
exporter's arithmetic in it; `length_shapes` gives Conv / pool outputs and Slice trims the same form,
so equal lengths get equal names and onnx's inference carries them on.
"""

from __future__ import annotations

import onnx

from .dim_forms import Dim, floor_divided, is_named, shifted
from .reshape_ranks import _attr, shape_walk

BIG = 1 << 62  # a Slice end at or past this reads to the end (INT64_MAX and friends)


def length_shapes(model: onnx.ModelProto, known: dict[str, list[Dim] | None]) -> dict[str, list[Dim]]:
    """Output name -> dims for Conv / MaxPool / AveragePool outputs, Slices of data, Range(0, n, 1) and
    ConstantOfShape whose lengths this computes where onnx left them unknown; `known` gets them too."""
    consts, found = {t.name: t for t in model.graph.initializer}, {}
    for node, values in shape_walk(model, known):
        out = known.get(node.output[0])
        if out is None:
            continue
        if node.op_type in ("Conv", "MaxPool", "AveragePool"):
            dims = _window(node, known.get(node.input[0]), consts, known, out)
        elif node.op_type == "Slice":
            dims = _trim(node, known.get(node.input[0]), values, out)
        elif node.op_type == "ConstantOfShape":  # torch.ones(b, frames): a default mask over computed lengths
            shape = values.get(node.input[0])
            dims = [d if is_named(d) or isinstance(d, int) else o for d, o in zip(shape, out)] \
                if shape is not None and len(shape) == len(out) else None
        elif node.op_type == "Range":  # arange(n): the positions of a mask over n frames
            start, limit, delta = (values.get(name) for name in node.input)
            dims = [limit[0]] if start == [0] and delta == [1] and limit is not None and len(out) == 1 \
                and is_named(limit[0]) and not is_named(out[0]) else None
        else:
            continue
        if dims is not None and dims != out:
            found[node.output[0]] = known[node.output[0]] = dims
    return found


def _window(node, src: list[Dim] | None, consts, known, out: list[Dim]) -> list[Dim] | None:
    """Spatial lengths of a Conv / pool: (n + pads - dilation * (k - 1) - 1) // stride + 1."""
    if src is None or len(src) != len(out) or _attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID") \
            or _attr(node, "ceil_mode", 0):
        return None
    spatial = len(src) - 2
    kernel = _attr(node, "kernel_shape")
    if kernel is None and node.op_type == "Conv" and len(node.input) > 1:  # the weight's shape, typed input or not
        weight = list(consts[node.input[1]].dims) if node.input[1] in consts else known.get(node.input[1])
        kernel = weight[2:] if weight is not None and all(isinstance(d, int) for d in weight) else None
    if kernel is None or len(kernel) != spatial:
        return None
    pads = _attr(node, "pads", [0] * 2 * spatial)
    strides, dilations = _attr(node, "strides", [1] * spatial), _attr(node, "dilations", [1] * spatial)
    dims = list(out)
    for i in range(spatial):
        if is_named(out[i + 2]) or isinstance(out[i + 2], int):
            continue
        reach = pads[i] + pads[i + spatial] - dilations[i] * (kernel[i] - 1) - 1
        length = shifted(floor_divided(shifted(src[i + 2], reach), strides[i]), 1)
        dims[i + 2] = length if length is not None else out[i + 2]
    return dims


def _trim(node, src: list[Dim] | None, values, out: list[Dim]) -> list[Dim] | None:
    """Slice(x, [start], [end], [axis]) with step 1, start >= 0 and end negative or to the end: the
    axis' length minus what it cuts (wav2vec2's positional conv drops its last frame); or
    Slice(x, [0], [n]) along an axis of length n, which keeps it whole."""
    if src is None or len(src) != len(out) or len(node.input) < 3:
        return None
    starts, ends = values.get(node.input[1]), values.get(node.input[2])
    axes = values.get(node.input[3]) if len(node.input) > 3 and node.input[3] else None
    steps = values.get(node.input[4]) if len(node.input) > 4 and node.input[4] else None
    if starts is None or ends is None or len(starts) != 1 or len(ends) != 1 or steps not in (None, [1]):
        return None
    axis = (axes or [0])[0]
    start, end = starts[0], ends[0]
    if not isinstance(axis, int) or not isinstance(start, int) or start < 0:
        return None
    axis %= len(src)
    if is_named(out[axis]) or isinstance(out[axis], int):
        return None
    if is_named(end) and end == src[axis]:  # x[:n] of an axis of length n (DeBERTa's rel_pos[:query_size, :]);
        # the other axes are not cut (onnx's inference drops them all when an end is not constant)
        return list(src) if start == 0 else None
    if not isinstance(end, int) or not (end < 0 or end >= BIG):
        return None
    length = shifted(src[axis], -start + (end if end < 0 else 0))
    return [length if a == axis else d for a, d in enumerate(out)] if length is not None else None
