"""Merged decoders (Optimum's decoder_model_merged.onnx): one If per graph picks the with-past or
the no-past decoder on a bool input, and a paged step always takes the with-past one.

    use_cache_branch ─► If ─┬─ then: decoder reading past_key_values.*  ─► logits, present.*
                            └─ else: decoder without them (first step)
    ==>  the with-past branch's nodes in the graph, its outputs renamed to the If's; the bool leaves

A paged step reads every past token from the KV pools, so the branch the program wants is the one
that reads the past KV inputs (rank-4 float graph inputs): exactly one branch must, else the build
refuses, naming the If. The condition is then an input the runner never feeds; the profile may still
list it (its entry is not used).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper

from ..errors import BadInput
from .sites import NOT_RECOGNIZED

FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)


@dataclass(frozen=True)
class FixedBranch:
    node: str  # the If's name
    condition: str  # the graph input it branched on
    branch: str  # "then_branch" or "else_branch": the one kept

    def to_json(self) -> dict:
        return {"if": self.node, "condition": self.condition, "branch": self.branch}


def take_cache_branches(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[FixedBranch]]:
    """The model with each top-level If on a bool graph input replaced by its with-past branch
    (a copy; the model itself when there is none)."""
    graph = model.graph
    bools = {i.name for i in graph.input if i.type.tensor_type.elem_type == TensorProto.BOOL}
    if not any(n.op_type == "If" and n.domain in ("", "ai.onnx") and n.input[0] in bools for n in graph.node):
        return model, []
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    past = {i.name for i in graph.input if _is_rank4_float(i)}
    taken = _names(graph)
    nodes, fixed = [], []
    for node in graph.node:
        if node.op_type != "If" or node.domain not in ("", "ai.onnx") or node.input[0] not in bools:
            nodes.append(node)
            continue
        branches = {a.name: a.g for a in node.attribute if a.name in ("then_branch", "else_branch")}
        reading = [name for name, branch in branches.items() if _outer_reads(branch) & past]
        if len(reading) != 1:
            raise BadInput(f"{NOT_RECOGNIZED}: If '{node.name}' on '{node.input[0]}': "
                           f"{'both' if reading else 'neither'} of its branches read the past KV inputs, "
                           "so a paged step cannot tell which one to take")
        nodes += _inlined(branches[reading[0]], list(node.output), taken, graph)
        fixed.append(FixedBranch(node.name, node.input[0], reading[0]))
    del graph.node[:]
    graph.node.extend(nodes)
    still_read = {name for n in graph.node for name in n.input} | _outer_reads(graph)
    kept = [i for i in graph.input if i.name not in {f.condition for f in fixed} or i.name in still_read]
    del graph.input[:]
    graph.input.extend(kept)
    return out, fixed


def _is_rank4_float(info: onnx.ValueInfoProto) -> bool:
    t = info.type.tensor_type
    return t.elem_type in FLOAT_TYPES and t.HasField("shape") and len(t.shape.dim) == 4


def _names(graph: onnx.GraphProto) -> set[str]:
    """Every value name defined at the top of `graph`."""
    return ({i.name for i in graph.input} | {t.name for t in graph.initializer}
            | {o for n in graph.node for o in n.output})


def _outer_reads(graph: onnx.GraphProto) -> set[str]:
    """Names that `graph` (and the subgraphs in it) read from enclosing scopes."""
    defined = _names(graph)
    reads = set()
    for node in graph.node:
        reads.update(name for name in node.input if name)
        for attribute in node.attribute:
            for sub in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs):
                reads |= _outer_reads(sub)
    return reads - defined


def _inlined(branch: onnx.GraphProto, outputs: list[str], taken: set[str], graph: onnx.GraphProto) -> list:
    """The branch's nodes for the enclosing graph: names it defines that the graph already has are
    renamed (the If's outputs are the branch outputs' new names), initializers and value infos move up."""
    renamed = {}
    for name in _names(branch):
        if name in taken:
            fresh, k = f"{name}__branch", 0
            while fresh in taken:
                k += 1
                fresh = f"{name}__branch{k}"
            renamed[name] = fresh
            taken.add(fresh)
    _rename(branch, renamed)
    graph.initializer.extend(branch.initializer)
    graph.value_info.extend(branch.value_info)
    nodes = list(branch.node)
    for result, inner in zip(outputs, branch.output):
        nodes.append(helper.make_node("Identity", [inner.name], [result], name=f"{result}__taken_branch"))
    return nodes


def _rename(graph: onnx.GraphProto, renamed: dict[str, str]) -> None:
    """Renames uses and definitions throughout `graph` and its subgraphs (a subgraph shadowing a
    renamed name is not expected in an exporter's branch)."""
    if not renamed:
        return
    for tensor in [*graph.initializer, *graph.value_info, *graph.output, *graph.input]:
        tensor.name = renamed.get(tensor.name, tensor.name)
    for node in graph.node:
        node.input[:] = [renamed.get(n, n) for n in node.input]
        node.output[:] = [renamed.get(n, n) for n in node.output]
        for attribute in node.attribute:
            for sub in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs):
                _rename(sub, renamed)
