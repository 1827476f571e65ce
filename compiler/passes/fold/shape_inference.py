"""Shape inference with symbolic dims.

Declared shapes are hints at best: a real model in the wild declares a wrong output shape, and a
popular simplifier trusts it and silently changes that model's output. So every declared shape of
an intermediate value or graph output is dropped and inferred afresh (onnx's inference with data
propagation); a declared dim of 0 on an input is read as unknown; any `dim_param` text is kept.
Where onnx leaves a Reshape's output unknown (computed target shapes at opset <= 13), the shape
from reshape_ranks.py is given to it and inference runs again, so the rest of the graph keeps ranks;
so are the broadcasts of a prefix slice that bounded_broadcast.py proves (dynamo's position embeddings)
and the lengths after convolutions and trims that symbolic_lengths.py names.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from google.protobuf.message import EncodeError

from ...graph import all_graphs
from ...model_io import EXTERNAL_DATA_THRESHOLD_BYTES, as_model_file, weights_as_inputs
from ..stats import PassStats
from .bounded_broadcast import broadcast_shapes
from .reshape_ranks import reshape_shapes
from .symbolic_lengths import length_shapes

MAX_RESHAPE_ROUNDS = 16  # a Reshape shape found can make later Reshape targets known (one round per link)


def _dims(type_proto: onnx.TypeProto):
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    dims = []
    for d in type_proto.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return dims


def infer_shapes(graph: gs.Graph) -> dict[str, tuple]:
    """Name -> (elem_type, dims) for every value onnx can infer, without touching the graph."""
    for g in all_graphs(graph):
        for tensor in g.inputs:
            if tensor.shape is not None:
                tensor.shape = [None if d == 0 else d for d in tensor.shape]
    with _weights_as_graph_inputs(graph):
        model = gs.export_onnx(graph, do_type_check=False)
    _weights_as_inputs(model.graph)  # those the swap left as they were (bfloat16 given as its ONNX type)
    del model.graph.value_info[:]
    for output in model.graph.output:
        output.type.tensor_type.ClearField("shape")
    inferred = _run_inference(model)
    given: dict[str, onnx.ValueInfoProto] = {}
    for _ in range(MAX_RESHAPE_ROUNDS):
        known = _known_dims(inferred)
        filled = reshape_shapes(inferred, known, frozenset(given))
        filled.update(broadcast_shapes(inferred, known))
        filled.update(length_shapes(inferred, known))
        if not filled:
            break
        for name, dims in filled.items():
            given[name] = onnx.helper.make_tensor_value_info(name, _elem_type(inferred, name), dims)
        del model.graph.value_info[:]
        model.graph.value_info.extend(given.values())
        inferred = _run_inference(model)
    found: dict[str, tuple] = {}
    _collect(inferred.graph, found)
    return found


# float initializers larger than this go to onnx's inference as typed inputs without their data: no
# shape is computed from a float tensor, and serializing a decoder's weights for it took 20 of the
# 45 s a 135M-parameter build took
WEIGHT_MIN_ELEMENTS = 64
FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                         onnx.TensorProto.DOUBLE})


def _is_float_weight(tensor: onnx.TensorProto) -> bool:
    size = 1
    for d in tensor.dims:
        size *= d
    return tensor.data_type in FLOAT_TYPES and size > WEIGHT_MIN_ELEMENTS


@contextlib.contextmanager
def _weights_as_graph_inputs(graph: gs.Graph):
    """Within the block the main graph's large float constants are typed graph inputs, so that the
    export for onnx's inference does not serialize their data (for a 2 GB decoder, two exports took
    28 of a 57 s optimization); they are constants again afterwards, values untouched."""
    swapped = []
    for tensor in graph.tensors().values():
        if isinstance(tensor, gs.Constant) and _is_float(tensor.dtype) and math.prod(tensor.shape) > WEIGHT_MIN_ELEMENTS:
            swapped.append((tensor, tensor._values, tensor.data_location))
    for tensor, *_ in swapped:
        tensor.to_variable(dtype=tensor.dtype, shape=list(tensor.shape))
        tensor.type = "tensor_type"  # what Variable() sets and to_variable does not
    graph.inputs.extend(tensor for tensor, *_ in swapped)
    try:
        yield
    finally:
        if swapped:
            del graph.inputs[-len(swapped):]
        for tensor, values, location in swapped:
            tensor.to_constant(values)
            tensor.data_location = location


def _is_float(dtype) -> bool:
    try:
        return np.dtype(dtype).kind == "f"
    except TypeError:  # an ONNX type NumPy does not name (bfloat16 given as its enum): left as it is
        return False


def _weights_as_inputs(graph: onnx.GraphProto) -> None:
    kept, inputs = weights_as_inputs(graph, _is_float_weight)
    if len(kept) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept)
        graph.input.extend(inputs)


def _run_inference(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        if model.ByteSize() < EXTERNAL_DATA_THRESHOLD_BYTES:
            return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except (ValueError, EncodeError):  # past protobuf's 2 GiB
        pass
    with as_model_file(model) as path:  # protobuf's 2 GiB limit: go through a file (`model` stays whole)
        onnx.shape_inference.infer_shapes_path(path, path + ".out", strict_mode=False, data_prop=True)
        return onnx.load(path + ".out", load_external_data=False)


def _known_dims(model: onnx.ModelProto) -> dict[str, list | None]:
    graph = model.graph
    known: dict[str, list | None] = {}
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        if value.type.HasField("tensor_type") and (known.get(value.name) is None):
            known[value.name] = _dims(value.type)  # a graph output without a shape keeps its value_info's
    return known


def _elem_type(model: onnx.ModelProto, name: str) -> int:
    """The element type onnx inferred for `name` (Reshape keeps its input's), 0 when unknown."""
    graph = model.graph
    for value in list(graph.value_info) + list(graph.output):
        if value.name == name:
            return value.type.tensor_type.elem_type
    producers = {o: n for n in graph.node for o in n.output}
    source = producers[name].input[0] if name in producers else None
    known = {v.name: v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.value_info)}
    known.update({t.name: t.data_type for t in graph.initializer})
    return known.get(source, 0)


def _collect(graph: onnx.GraphProto, found: dict, owners: dict | None = None, ambiguous: set | None = None) -> None:
    """Fills `found` by name. The results are applied by name to every graph, so a name that two
    sibling subgraphs give different types or shapes (the two branches of a merged decoder's If,
    each with its own '/model/Cast_1_output_0', bool in one and int64 in the other) is left out."""
    top = owners is None
    owners, ambiguous = ({}, set()) if top else (owners, ambiguous)
    for value in list(graph.value_info) + list(graph.output):
        if not value.type.HasField("tensor_type"):
            continue
        entry = (value.type.tensor_type.elem_type or found.get(value.name, (0,))[0], _dims(value.type))
        if owners.setdefault(value.name, id(graph)) != id(graph):
            if found.get(value.name) != entry:
                ambiguous.add(value.name)
            continue
        if value.name not in found or entry[1] is not None:
            found[value.name] = entry
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                _collect(sub, found, owners, ambiguous)
    if top:
        for name in ambiguous:
            del found[name]


class InferShapes:
    name = "shape_inference"

    def run(self, graph: gs.Graph, stats: PassStats) -> int:
        try:
            found = infer_shapes(graph)
        except (onnx.shape_inference.InferenceError, RuntimeError) as exc:
            stats.record_rejection("infer_shapes", f"onnx shape inference failed: {str(exc).splitlines()[0][:160]}", "graph")
            return 0
        num_known = 0
        for g in all_graphs(graph):
            for tensor in g.tensors().values():
                if isinstance(tensor, gs.Constant) or tensor in g.inputs:
                    continue
                entry = found.get(tensor.name)
                if entry is None:
                    tensor.shape = None  # never keep a declared shape that inference could not confirm
                    continue
                elem_type, dims = entry
                if elem_type:
                    tensor.dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
                tensor.shape = dims
                num_known += 1
        stats.record_match("values_with_inferred_type", 0)
        stats.rule("values_with_inferred_type").matched = num_known
        return 0  # inference informs the other passes; it never changes the graph itself
