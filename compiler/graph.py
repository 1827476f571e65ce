"""The graph wrapper both halves share: onnx-graphsurgeon import/export plus small helpers."""

from __future__ import annotations

import itertools
import sys
from typing import Iterator

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnx_graphsurgeon.logger.logger as _gs_logger

from .model_io import MAX_IR_VERSION

# graphsurgeon prints its warnings ("Could not convert: UNDEFINED ..." for a map type, a note that
# the colored module is missing) on stdout, which is the --json output users parse: they go to
# stderr, uncolored. (Its logger calls the module's `print`; sys.stderr is read at each call, so a
# test's captured stderr gets them.)
_gs_logger.print = lambda *args, **kwargs: print(*args, **{**kwargs, "file": sys.stderr})
_gs_logger.G_LOGGER.colors = False

# Contrib ops our fusions may write, by domain (GUIDE.md section 3: fused nodes stay runnable by ORT).
CONTRIB_DOMAIN = "com.microsoft"


def import_graph(model: onnx.ModelProto) -> gs.Graph:
    return gs.import_onnx(model)


def export_model(graph: gs.Graph, original: onnx.ModelProto) -> onnx.ModelProto:
    """Export and carry over what graphsurgeon drops: metadata, functions, domains used by new nodes."""
    model = gs.export_onnx(graph, do_type_check=False)
    model.ir_version = min(original.ir_version or MAX_IR_VERSION, MAX_IR_VERSION)
    model.producer_name = original.producer_name
    model.producer_version = original.producer_version
    model.domain = original.domain
    model.model_version = original.model_version
    model.doc_string = original.doc_string
    del model.metadata_props[:]
    model.metadata_props.extend(original.metadata_props)
    del model.opset_import[:]
    model.opset_import.extend(original.opset_import)
    known = {o.domain for o in model.opset_import}
    for domain in sorted(_domains_used(model.graph) - known):
        model.opset_import.append(onnx.helper.make_opsetid(domain, 1))
    if not model.functions and original.functions:
        model.functions.extend(original.functions)
    _restore_non_tensor_types(model.graph, original.graph)
    _forget_placeholder_dims(model.graph, _declared_dim_names(original.graph))
    return model


PLACEHOLDER_PREFIX = "unk__"  # onnx's inference names each dim it knows nothing of unk__N


def _declared_dim_names(graph: onnx.GraphProto) -> set[str]:
    return {d.dim_param for v in list(graph.input) + list(graph.output) if v.type.HasField("tensor_type")
            for d in v.type.tensor_type.shape.dim if d.dim_param}


def _forget_placeholder_dims(graph: onnx.GraphProto, declared: set[str]) -> None:
    """Intermediate values keep no dim onnx only labelled unk__N: onnxruntime reads two equal
    labels as equal sizes and shares one buffer between them, and onnx's labels are not always
    right (its Slice-10 inference labels `x[:, 0:0]` as x's unk__0: "Shape mismatch attempting to
    re-use buffer", fuzz_graphs --forms old seed 983). A name the model itself declares stays."""
    for value in list(graph.value_info) + list(graph.output):
        if not value.type.HasField("tensor_type"):
            continue
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param.startswith(PLACEHOLDER_PREFIX) and dim.dim_param not in declared:
                dim.Clear()
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                _forget_placeholder_dims(sub, declared)


def _is_non_tensor(value: onnx.ValueInfoProto) -> bool:
    return value.type.WhichOneof("value") not in ("tensor_type", None)


def _restore_non_tensor_types(graph: onnx.GraphProto, original: onnx.GraphProto) -> None:
    """graphsurgeon writes every value as a tensor or a sequence of tensors: a sequence of maps (a
    ZipMap's output) comes back as a sequence of tensors of undefined type, which onnxruntime refuses.
    The original's types are put back by name; a mangled one with no original is dropped."""
    types = {v.name: v.type for v in [*original.input, *original.output, *original.value_info] if _is_non_tensor(v)}
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.name in types:
            value.type.CopyFrom(types[value.name])
    kept = [v for v in graph.value_info if not (_is_non_tensor(v) and v.name not in types)]
    if len(kept) != len(graph.value_info):
        del graph.value_info[:]
        graph.value_info.extend(kept)


def _domains_used(graph: onnx.GraphProto) -> set[str]:
    found = set()
    for node in graph.node:
        found.add("" if node.domain == "ai.onnx" else node.domain)
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                found |= _domains_used(sub)
    return found


def opset_of(graph: gs.Graph, domain: str = "") -> int:
    opsets = graph.import_domains or []
    for entry in opsets:
        if entry.domain in (domain, "ai.onnx" if domain == "" else domain):
            return entry.version
    return graph.opset


def all_graphs(graph: gs.Graph) -> list[gs.Graph]:
    """The main graph followed by every nested subgraph (If/Loop/Scan bodies), each before the
    graphs inside it. A plain loop over the attributes: gs's Node.subgraphs generator cost 12 us a
    node, 11 of the 93 s `optimize` took on a 6,700-node decoder that has no subgraph at all."""
    found = []

    def visit(g: gs.Graph) -> None:
        found.append(g)
        for node in g.nodes:
            for value in node.attrs.values():
                if isinstance(value, gs.Graph):
                    visit(value)

    visit(graph)
    return found


def const_value(tensor: gs.Tensor | None) -> np.ndarray | None:
    if isinstance(tensor, gs.Constant):
        return np.asarray(tensor.values)
    return None


def is_scalar_const(tensor: gs.Tensor | None, value: float, rtol: float = 1e-3) -> bool:
    """True when `tensor` is a constant whose every element is close to `value`."""
    arr = const_value(tensor)
    if arr is None or arr.size == 0 or arr.dtype.kind not in "fiu":
        return False
    return bool(np.allclose(arr.astype(np.float64), value, rtol=rtol, atol=1e-6))


def is_float(tensor: gs.Tensor) -> bool:
    """Floating point, or of unknown type (checks that need a dtype decline elsewhere)."""
    return tensor.dtype is None or np.dtype(tensor.dtype).kind == "f"


def consumers(tensor: gs.Tensor) -> list[gs.Node]:
    return list(tensor.outputs)


def graph_output_names(graph: gs.Graph) -> set[str]:
    return {t.name for t in graph.outputs}


class NameGen:
    """Fresh, unique tensor and node names for rewrites (one per top-level graph)."""

    def __init__(self, graph: gs.Graph | None = None):
        self._taken = set()
        for g in all_graphs(graph) if graph is not None else ():
            self._taken.update(g.tensors().keys())
            self._taken.update(n.name for n in g.nodes if n.name)
        self._counter = itertools.count()

    @classmethod
    def of_onnx(cls, graph) -> NameGen:
        """The same for an onnx GraphProto (its nodes, their outputs, its initializers and inputs)."""
        names = cls()
        names._taken.update(n.name for n in graph.node)
        names._taken.update(o for n in graph.node for o in n.output)
        names._taken.update(t.name for t in [*graph.initializer, *graph.input])
        return names

    def __call__(self, hint: str) -> str:
        while True:
            name = f"{hint}_{next(self._counter)}"
            if name not in self._taken:
                self._taken.add(name)
                return name


def iter_nodes(graph: gs.Graph) -> Iterator[tuple[gs.Graph, gs.Node]]:
    for g in all_graphs(graph):
        for node in list(g.nodes):
            yield g, node


def node_count(graph: gs.Graph) -> int:
    return sum(len(g.nodes) for g in all_graphs(graph))
