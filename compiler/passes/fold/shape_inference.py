"""Shape inference with symbolic dims.

Declared shapes are hints at best: a real model in the wild declares a wrong output shape, and a
popular simplifier trusts it and silently changes that model's output. So every declared shape of
an intermediate value or graph output is dropped and inferred afresh (onnx's inference with data
propagation); a declared dim of 0 on an input is read as unknown; any `dim_param` text is kept.
Where onnx leaves a Reshape's output unknown (computed target shapes at opset <= 13), the shape
from reshape_ranks.py is given to it and inference runs again, so the rest of the graph keeps ranks;
so are the broadcasts of a prefix slice that bounded_broadcast.py proves (dynamo's position embeddings)
and the lengths after convolutions and trims that symbolic_lengths.py names. A Slice's symbolic dim
that onnx copies from its input on an axis not taken whole is forgotten (slice_dims.py).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from google.protobuf.message import EncodeError

from ...graph import PLACEHOLDER_PREFIX, all_graphs
from ...model_io import EXTERNAL_DATA_THRESHOLD_BYTES, as_model_file, weights_as_inputs
from ..stats import PassStats
from .bounded_broadcast import broadcast_shapes
from .reshape_ranks import reshape_shapes
from .slice_dims import correct_slice_dims
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
    """Name -> (elem_type, dims) for every value of the main graph onnx can infer, without touching
    the graph."""
    return infer_scoped_shapes(graph)[()]


def infer_scoped_shapes(graph: gs.Graph) -> dict[tuple, dict[str, tuple]]:
    """infer_shapes for the main graph and each subgraph, by scope (_collect)."""
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
        elem_type = _elem_types(inferred)
        for name, dims in filled.items():
            given[name] = onnx.helper.make_tensor_value_info(name, elem_type(name), dims)
        del model.graph.value_info[:]
        model.graph.value_info.extend(given.values())
        inferred = _run_inference(model)
    return _collect(inferred.graph)


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


def _elem_types(model: onnx.ModelProto):
    """name -> the element type onnx inferred for it (Reshape keeps its input's), 0 when unknown;
    the tables built once for all the names a round fills."""
    graph = model.graph
    inferred = {v.name: v.type.tensor_type.elem_type for v in reversed(list(graph.value_info) + list(graph.output))}
    producers = {o: n for n in graph.node for o in n.output}
    known = {v.name: v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.value_info)}
    known.update({t.name: t.data_type for t in graph.initializer})

    def elem_type(name: str) -> int:
        if name in inferred:
            return inferred[name]
        source = producers[name].input[0] if name in producers else None
        return known.get(source, 0)

    return elem_type


# ops whose output is one element of a sequence: onnx gives it the sequence's element type, whose
# unknown dims carry one placeholder symbol ('unk__0') for every element, so two SequenceAt of parts
# of different sizes read as equal; written to the optimized model, onnxruntime planned one buffer
# for both and failed ('Shape mismatch attempting to re-use buffer', fuzz_graphs seed 1009)
ELEMENT_READS = frozenset({"SequenceAt"})


def _without_placeholders(dims: list | None) -> list | None:
    if dims is None:
        return None
    return [None if isinstance(d, str) and d.startswith(PLACEHOLDER_PREFIX) else d for d in dims]


Scope = tuple  # a subgraph's path from the main graph: ((node index, attribute name[, index]), ...)


def _collect(graph: onnx.GraphProto) -> dict[Scope, dict[str, tuple]]:
    """Each graph's own inferred values by name, keyed by the graph's scope: two sibling subgraphs
    may each define one name with its own type and shape (the two branches of a merged decoder's
    If, each with its own '/model/Cast_1_output_0', bool in one and int64 in the other)."""
    scopes: dict[Scope, dict[str, tuple]] = {}

    def walk(g: onnx.GraphProto, scope: Scope) -> None:
        own: dict[str, tuple] = {}
        for value in list(g.value_info) + list(g.output):
            if value.type.HasField("tensor_type"):
                entry = (value.type.tensor_type.elem_type or own.get(value.name, (0,))[0], _dims(value.type))
                if value.name not in own or entry[1] is not None:
                    own[value.name] = entry
        for node in g.node:
            if node.op_type in ELEMENT_READS and node.output and node.output[0] in own:
                elem_type, dims = own[node.output[0]]
                own[node.output[0]] = (elem_type, _without_placeholders(dims))
        seen_dims = {v.name: _dims(v.type) for v in g.input if v.type.HasField("tensor_type")}
        seen_dims.update({name: dims for name, (_, dims) in own.items()})
        correct_slice_dims(g, own, seen_dims)
        scopes[scope] = own
        for index, node in enumerate(g.node):
            for attr in node.attribute:
                if attr.HasField("g"):
                    walk(attr.g, (*scope, (index, attr.name)))
                for k, sub in enumerate(attr.graphs):
                    walk(sub, (*scope, (index, attr.name, k)))

    walk(graph, ())
    return scopes


def _scoped_graphs(graph: gs.Graph, scope: Scope = ()):
    """(scope, graph) for the main graph and every subgraph, scoped as _collect scopes them."""
    yield scope, graph
    for index, node in enumerate(graph.nodes):
        for name, value in node.attrs.items():
            if isinstance(value, gs.Graph):
                yield from _scoped_graphs(value, (*scope, (index, name)))
            elif isinstance(value, (list, tuple)):
                for k, sub in enumerate(value):
                    if isinstance(sub, gs.Graph):
                        yield from _scoped_graphs(sub, (*scope, (index, name, k)))


def _lookup(scopes: dict[Scope, dict[str, tuple]], scope: Scope, name: str) -> tuple | None:
    """`name` as the graph at `scope` sees it: its own value, else the nearest enclosing graph's."""
    while True:
        entry = scopes.get(scope, {}).get(name)
        if entry is not None or not scope:
            return entry
        scope = scope[:-1]


class InferShapes:
    name = "shape_inference"

    def run(self, graph: gs.Graph, stats: PassStats) -> int:
        try:
            found = infer_scoped_shapes(graph)
        except (onnx.shape_inference.InferenceError, RuntimeError) as exc:
            stats.record_rejection("infer_shapes", f"onnx shape inference failed: {str(exc).splitlines()[0][:160]}", "graph")
            return 0
        num_known = 0
        seen: dict[int, tuple | None] = {}  # a tensor object two scopes share gets one answer
        # the model's outputs as it declares them: where onnx infers no shape, the declaration stays
        # (dropped, onnxruntime could not size a Scan fed by a Loop's stacked output: fuzz_graphs)
        declared_outputs = {id(t) for t in graph.outputs if t.shape is not None}
        for scope, g in _scoped_graphs(graph):
            for tensor in g.tensors().values():
                if isinstance(tensor, gs.Constant) or tensor in g.inputs:
                    continue
                entry = _lookup(found, scope, tensor.name)
                if id(tensor) in seen:
                    if seen[id(tensor)] == entry:
                        continue
                    entry = None  # two answers for one object: confirm neither
                seen[id(tensor)] = entry
                keeps_declared = id(tensor) in declared_outputs and (entry is None or entry[1] is None)
                if entry is None:
                    if not keeps_declared:
                        tensor.shape = None  # never keep a declared shape that inference could not confirm
                    continue
                elem_type, dims = entry
                if elem_type:
                    tensor.dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
                if not keeps_declared:
                    tensor.shape = dims
                num_known += 1
        stats.record_match("values_with_inferred_type", 0)
        stats.rule("values_with_inferred_type").matched = num_known
        return 0  # inference informs the other passes; it never changes the graph itself
