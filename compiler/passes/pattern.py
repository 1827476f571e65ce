"""Patterns written like the graph they match: `op.Add(op.Mul(x, gamma), beta)`.

A pattern is a small DAG of `OpPattern` nodes whose leaves are captures (`var`, `const`). Reusing
one pattern object in two places means "the same graph node" (e.g. the `x - mean` that feeds both
Pow and Div in a LayerNorm); reusing a capture name means "the same value".
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False, frozen=True)
class Capture:
    name: str
    is_const: bool = False


@dataclass(eq=False, frozen=True)
class OpPattern:
    op_types: tuple[str, ...]
    inputs: tuple["PatternValue", ...]
    name: str | None = None
    domain: str = ""
    # The graph node may carry more inputs than the pattern lists (e.g. optional ones).
    allow_extra_inputs: bool = False

    def __getitem__(self, index: int) -> "OutputRef":
        return OutputRef(self, index)


@dataclass(eq=False, frozen=True)
class OutputRef:
    """The `index`-th output of a multi-output node (Split, LayerNormalization, ...)."""

    node: OpPattern
    index: int


PatternValue = Capture | OpPattern | OutputRef


def var(name: str) -> Capture:
    return Capture(name)


def const(name: str) -> Capture:
    return Capture(name, is_const=True)


@dataclass(frozen=True)
class _OpFactory:
    """`op.Relu(x)` builds an OpPattern; `op.any("Relu", "Sigmoid")(x)` matches several op types."""

    domain: str = field(default="")

    def __getattr__(self, op_type: str):
        if op_type.startswith("_"):
            raise AttributeError(op_type)
        return self.any(op_type)

    def any(self, *op_types: str):
        def build(*inputs: PatternValue, name: str | None = None, allow_extra_inputs: bool = False) -> OpPattern:
            return OpPattern(tuple(op_types), tuple(inputs), name, self.domain, allow_extra_inputs)

        return build


op = _OpFactory()
ms_op = _OpFactory("com.microsoft")


def pattern_nodes(root: OpPattern) -> list[OpPattern]:
    """Every OpPattern reachable from `root`, root first, each once."""
    seen: dict[int, OpPattern] = {}
    stack: list[PatternValue] = [root]
    while stack:
        item = stack.pop()
        if isinstance(item, OutputRef):
            item = item.node
        if isinstance(item, OpPattern) and id(item) not in seen:
            seen[id(item)] = item
            stack.extend(item.inputs)
    return list(seen.values())
