"""Lowering: an (optimized) graph becomes a kernel program, an ordered list of steps over named
values, plus the weights. Ops with no native kernel are grouped into onnxruntime islands."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from .errors import BadInput
from .lower_fuse import fuse_program
from .lower_sequences import OpenSequences, sink_sequence_makers

ISLAND_OP = "__island__"


@dataclass
class Program:
    steps: list[dict]
    weights: dict[str, np.ndarray]
    inputs: list[dict]
    outputs: list[dict]
    opset: int
    islands: dict[str, bytes] = field(default_factory=dict)  # section name -> ONNX model bytes

    @property
    def fallback_ops(self) -> list[str]:
        return sorted({op for s in self.steps if s["op"] == ISLAND_OP for op in s["ops"]})


def dtype_name(dtype) -> str | None:
    if dtype is None:
        return None
    if isinstance(dtype, (int, np.integer)):  # graphsurgeon keeps bfloat16/float8/int4 as TensorProto codes
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(dtype))).name
    return np.dtype(dtype).name


def value_info(tensor: gs.Tensor) -> dict:
    shape = None if tensor.shape is None else [d if isinstance(d, (int, np.integer)) and d >= 0 else (d if isinstance(d, str) else None)
                                               for d in tensor.shape]
    return {"name": tensor.name, "dtype": dtype_name(tensor.dtype), "shape": [int(d) if isinstance(d, (int, np.integer)) else d for d in shape] if shape is not None else None}


def attr_to_json(value):
    """Attributes as JSON data; None for attributes that cannot be (subgraphs)."""
    if isinstance(value, gs.Graph):
        return None
    if isinstance(value, gs.Constant):
        value = np.asarray(value.values)
    if isinstance(value, onnx.TensorProto):
        value = onnx.numpy_helper.to_array(value)
    if isinstance(value, np.ndarray):
        return {"tensor": {"dtype": value.dtype.name, "shape": list(value.shape), "data": value.ravel().tolist()}}
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (list, tuple)):
        items = [attr_to_json(v) for v in value]
        return None if any(i is None for i in items) and value else items
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return None


def _lowerable(node: gs.Node, has_kernel: Callable[[str, str], bool]) -> bool:
    if not has_kernel(node.domain or "", node.op):
        return False
    return all(attr_to_json(v) is not None or v is None for v in node.attrs.values())


def lower_graph(graph: gs.Graph, has_kernel: Callable[[str, str], bool], opset: int | None = None,
                allow_fallback: bool = True) -> Program:
    graph.toposort()
    graph.nodes = sink_sequence_makers(list(graph.nodes), graph)
    weights = {}
    for tensor in graph.tensors().values():
        if isinstance(tensor, gs.Constant):
            weights[tensor.name] = np.require(np.asarray(tensor.values), requirements="C")  # keeps 0-d scalars 0-d
    steps: list[dict] = []
    pending_island: list[gs.Node] = []
    islands: dict[str, bytes] = {}

    sequences = OpenSequences(graph)  # an island holding a sequence takes every node until it is read

    def flush():
        if pending_island:
            steps.append(_island_step(graph, pending_island, islands))
            pending_island.clear()
            sequences.closed()

    if not allow_fallback:
        missing = sorted({f"{n.domain + '.' if n.domain else ''}{n.op}" for n in graph.nodes if not _lowerable(n, has_kernel)})
        if missing:
            raise BadInput(f"no native kernel for: {', '.join(missing)} (--no-fallback)")
    for node in graph.nodes:
        if _lowerable(node, has_kernel) and not sequences.is_open():
            flush()
            steps.append({
                "op": node.op, "domain": node.domain or "", "name": node.name,
                "inputs": [t.name if not t.is_empty() else "" for t in node.inputs],
                "outputs": [t.name if not t.is_empty() else "" for t in node.outputs],
                "attrs": {k: attr_to_json(v) for k, v in node.attrs.items() if v is not None},
            })
        else:
            pending_island.append(node)
            sequences.joined(node)
    flush()
    steps = fuse_program(steps, weights, graph)
    program = Program(steps, weights, [value_info(t) for t in graph.inputs], [value_info(t) for t in graph.outputs],
                      opset if opset is not None else graph.opset, islands)
    return program


def _island_step(graph: gs.Graph, nodes: list[gs.Node], islands: dict[str, bytes]) -> dict:
    """A subgraph session over consecutive nodes without native kernels."""
    produced = {id(t) for n in nodes for t in n.outputs}
    inputs, seen = [], set()
    for n in nodes:
        for t in [*n.inputs, *_outer_values(n)]:
            if not t.is_empty() and id(t) not in produced and id(t) not in seen and not isinstance(t, gs.Constant):
                seen.add(id(t))
                inputs.append(t)
    consumers_outside = {id(t) for t in graph.outputs}
    node_ids = {id(n) for n in nodes}
    for other in graph.nodes:
        if id(other) not in node_ids:
            consumers_outside.update(id(t) for t in other.inputs)
            for sub in other.subgraphs(recursive=True):
                for sn in sub.nodes:
                    consumers_outside.update(id(t) for t in sn.inputs)
    outputs = [t for n in nodes for t in n.outputs if id(t) in consumers_outside]
    sub = gs.Graph(nodes=[_copy_node(n, i) for i, n in enumerate(nodes)], inputs=inputs, outputs=outputs, opset=graph.opset,
                   import_domains=graph.import_domains)
    model = gs.export_onnx(sub, do_type_check=False)
    for copy in sub.nodes:  # unhook the copies: the main graph's tensors keep their one producer
        copy.inputs.clear()
        copy.outputs.clear()
    model.ir_version = min(model.ir_version, 10)
    name = f"island{len(islands)}"
    islands[name] = model.SerializeToString()
    return {"op": ISLAND_OP, "domain": "", "section": name, "ops": sorted({n.op for n in nodes}),
            "inputs": [t.name for t in inputs], "outputs": [t.name for t in outputs], "attrs": {}}


def _outer_values(node: gs.Node) -> list[gs.Tensor]:
    """Values an If/Loop/Scan body reads from the enclosing graph: the island must take them as inputs."""
    local = set()
    for sub in node.subgraphs(recursive=True):
        local.update(id(t) for t in sub.inputs)
        local.update(id(t) for n in sub.nodes for t in n.outputs)
    return [t for sub in node.subgraphs(recursive=True) for n in sub.nodes for t in n.inputs if id(t) not in local]


def _copy_node(node: gs.Node, index: int) -> gs.Node:
    # The island graph gets shallow copies pointing at the same tensors, unhooked after export.
    # A distinct name matters: graphsurgeon unhooks producers by equality, which compares names; and
    # onnxruntime refuses two nodes of one name, which unnamed nodes would share without the index.
    return gs.Node(node.op, f"{node.name or node.op}#island{index}", dict(node.attrs), list(node.inputs),
                   list(node.outputs), node.domain)
