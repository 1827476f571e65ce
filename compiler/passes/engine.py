"""The one rewrite engine: finds pattern matches, asks the rule, splices the replacement.

The engine (not each fusion) handles commuted inputs (matcher), interior values used outside the
match, splicing, provenance tags on new nodes and per-rule counts of matches and rejections.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import onnx_graphsurgeon as gs

from ..graph import NameGen, all_graphs, const_value, opset_of
from .matcher import Bindings, match_node
from .opset_forms import form_missing
from .pattern import OpPattern, pattern_nodes
from .stats import PassStats


class Match:
    """What a rule's `check` and `rewrite` see: captured values and the matched nodes by name."""

    def __init__(self, graph: gs.Graph, root: gs.Node, pattern: OpPattern, bindings: Bindings, names: NameGen):
        self.graph = graph
        self.root = root
        self.values = bindings.values
        self._names = names
        self._nodes_by_pattern = bindings.nodes
        self.nodes = list({id(n): n for n in bindings.nodes.values()}.values())
        self._by_name = {p.name: bindings.nodes[id(p)] for p in pattern_nodes(pattern) if p.name}
        self.outputs = list(root.outputs)
        self.exposed: dict[str, list[gs.Tensor]] = {}

    def __getitem__(self, name: str) -> gs.Tensor:
        return self.values[name]

    def node(self, name: str) -> gs.Node:
        return self._by_name[name]

    def const(self, name: str) -> np.ndarray | None:
        return const_value(self.values.get(name))

    def fresh(self, hint: str) -> str:
        return self._names(hint)

    def value(self, hint: str, like: gs.Tensor | None = None, dtype=None, shape=None) -> gs.Variable:
        """A new intermediate value; dtype and shape default to those of `like`."""
        return gs.Variable(self.fresh(hint), dtype=dtype if dtype is not None else getattr(like, "dtype", None),
                           shape=shape if shape is not None else getattr(like, "shape", None))

    def constant(self, hint: str, array) -> gs.Constant:
        return gs.Constant(self.fresh(hint), np.ascontiguousarray(array))


Check = Callable[[Match], "str | None"]

# A `check` may return this to say "the pattern matched, but there is nothing to do here" (e.g. a
# Gemm that already has the layout a rule would produce): not a rejection, so not counted.
NOT_APPLICABLE = "<not applicable>"
Rewrite = Callable[[Match], Sequence[gs.Node]]


@dataclass(frozen=True)
class Rule:
    """A fusion or rewrite. `check` returns None to accept or a reason string to decline.

    `rewrite` builds the replacement; its last nodes must write `m.outputs` (the root's outputs,
    so downstream consumers and output names stay). Interior nodes named in `exposed` may have
    outputs used outside the match; the rewrite must write `m.exposed[name]` too.
    """

    name: str
    pattern: OpPattern
    rewrite: Rewrite
    check: Check = lambda m: None
    exposed: tuple[str, ...] = ()
    # True where the replacement may use ops newer than the model's opset because a later step
    # replaces them before anything runs the graph (the paged decoder's ONNX Attention)
    any_opset: bool = False


class RewritePass:
    def __init__(self, name: str, rules: Sequence[Rule]):
        self.name = name
        self.rules = tuple(rules)

    def run(self, graph: gs.Graph, stats: PassStats) -> int:
        names = NameGen(graph)
        num_changes = 0
        for g in all_graphs(graph):
            removed: set[int] = set()
            local = {id(n) for n in g.nodes}  # grows with the rewrites' nodes
            for node in list(g.nodes):
                if id(node) in removed:
                    continue
                declined = []  # recorded only when no rule of this pass rewrote the node
                for rule in self.rules:
                    if node.op not in rule.pattern.op_types:
                        continue
                    consumed, reason = self._try(rule, g, node, names, stats, local)
                    if consumed:
                        removed.update(id(n) for n in consumed)
                        num_changes += 1
                        break
                    if reason is not None:
                        declined.append((rule.name, reason))
                else:
                    for rule_name, reason in declined:
                        stats.record_rejection(rule_name, reason, node.name or node.outputs[0].name)
            if removed:
                g.cleanup(remove_unused_graph_inputs=False).toposort()
        return num_changes

    def _try(self, rule: Rule, g: gs.Graph, node: gs.Node, names: NameGen, stats: PassStats, local: set[int]):
        first_reason = None
        for bindings in match_node(rule.pattern, node, Bindings()):
            m = Match(g, node, rule.pattern, bindings, names)
            reason = _outside_graph(m, local) or _escaping_interior(m, rule) or rule.check(m)
            if reason == NOT_APPLICABLE:
                continue
            if reason is None:
                new_nodes = _build(m, rule)
                reason = None if rule.any_opset else form_missing(new_nodes, opset_of(m.graph))
                if reason is not None:  # an op or form the model's opset lacks: undone, declined
                    _discard(new_nodes)
                    first_reason = first_reason or reason
                    continue
                local.update(id(n) for n in _commit(m, new_nodes))
                stats.record_match(rule.name)
                return m.nodes, None
            first_reason = first_reason or reason
        return None, first_reason


def _outside_graph(m: Match, local: set[int]) -> str | None:
    """A subgraph's pattern may read an enclosing graph's values but not take its nodes: rewritten
    from inside, the outer node's other readers (out of the subgraph's sight) would lose their
    value (a LayerNormalization in an If branch fused with the Add before the If)."""
    if any(id(n) not in local for n in m.nodes):
        return "the pattern reaches into an enclosing graph"
    return None


def _escaping_interior(m: Match, rule: Rule) -> str | None:
    matched = {id(n) for n in m.nodes}
    graph_outputs = {id(t) for t in m.graph.outputs}
    exposed_ids = {id(m.node(name)) for name in rule.exposed if name in m._by_name}
    for node in m.nodes:
        if node is m.root:
            continue
        for out in node.outputs:
            escapes = id(out) in graph_outputs or any(id(c) not in matched for c in out.outputs)
            if escapes and id(node) not in exposed_ids:
                return f"an interior {node.op} output is used outside the pattern"
    return None


def _build(m: Match, rule: Rule) -> list[gs.Node]:
    for name in rule.exposed:
        if name in m._by_name:
            m.exposed[name] = list(m.node(name).outputs)
    # Build first, while the matched nodes still hold their inputs, then detach them: the old
    # producers leave their output tensors, and the new nodes become those tensors' producers.
    # New nodes are named before the old ones are detached: graphsurgeon unhooks a producer from
    # its tensors by equality, which compares names, so a same-looking new node must differ in name.
    new_nodes = list(rule.rewrite(m))
    for index, node in enumerate(new_nodes):
        node.name = m.fresh(f"{rule.name}/{m.root.name or m.root.op}" + (f"/{index}" if index else ""))
    return new_nodes


def _discard(new_nodes: list[gs.Node]) -> None:
    """Unhook a replacement never spliced in: its nodes leave the tensors they read and wrote."""
    for node in new_nodes:
        node.inputs.clear()
        node.outputs.clear()


def _commit(m: Match, new_nodes: list[gs.Node]) -> list[gs.Node]:
    for node in m.nodes:
        node.inputs.clear()
        node.outputs.clear()
    m.graph.nodes.extend(new_nodes)
    return new_nodes
