"""Per node: compute in the low precision, in fp32 (pinned), or in fp32 between low-precision Casts
(emulated: onnxruntime's CPU provider has no kernel for that op in that type); per value: the type
it is stored in (its home). Decided in topological order, one node at a time, from rules as data."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from .fp32_ops import (
    ATTRIBUTE_TYPED_OPS,
    FOLLOW_FP32_OPS,
    INFC_CPU_LOW_OPS,
    INFC_CPU_READERS,
    NUMPY_DTYPES,
    exceeds,
    fits,
    retyped_attribute_node,
)
from .graph_types import ValueType, node_groups, opsets, type_string
from .kernels import has_cpu_kernel
from .model_parts import outer_names_used_by_subgraphs

FLOAT = onnx.TensorProto.FLOAT
LOW, FP32, EMULATED, KEEP = "low", "fp32", "emulated", "keep"
# A float value computed only from integers and small constants (positions, masks, rotary angles)
# stays fp32: small tensors, and values like positions above 2048 are not exact in fp16.
INDEX_CONSTANT_MAX_ELEMENTS = 1024
INDEX_TYPES = (onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL)
_UNKNOWN = ValueType(0, None)


@dataclass
class NodePlan:
    state: str
    reason: str
    converts: frozenset  # type parameters retyped to the low precision (in LOW/EMULATED state)
    free: frozenset  # type parameters of a lone input (Shape's T, Cast's T1): any float type is fine


@dataclass
class _Context:
    model: onnx.ModelProto
    types: dict[str, ValueType]
    sources: dict[str, np.ndarray]  # fp32 constants: retyped offline, never by a Cast
    low: int
    fp32_ops: dict[str, str]
    pinned: set[str]
    kernels: str  # fp32_ops.KERNEL_SETS
    homes: dict[str, int] = field(default_factory=dict)
    index_valued: set[str] = field(default_factory=set)
    feeds_subgraph: set[str] = field(default_factory=set)
    # fp32 values that may hold finite magnitudes past the low type's range: computed in fp32 from a
    # constant that does not fit it (a mask filled with float32's lowest). Where a low-precision
    # node reads one, the conversion saturates it (emit.py) rather than let the Cast make it inf.
    beyond_low: set[str] = field(default_factory=set)

    def reads_beyond_low(self, node: onnx.NodeProto, runtime_inputs: list[str]) -> bool:
        return any(n in self.beyond_low for n in runtime_inputs) or any(
            n in self.sources and exceeds(self.sources[n], NUMPY_DTYPES[self.low]) for n in node.input if n)

    def is_index_computation(self, node: onnx.NodeProto, runtime_inputs: list[str]) -> bool:
        return bool(runtime_inputs) and all(n in self.index_valued for n in runtime_inputs) and all(
            n not in self.sources or self.sources[n].size <= INDEX_CONSTANT_MAX_ELEMENTS for n in node.input if n)


def plan_nodes(model: onnx.ModelProto, types: dict[str, ValueType], sources: dict[str, np.ndarray], low: int,
               keep_io_types: bool, fp32_ops: dict[str, str], pinned: set[str], kernels: str):
    ctx = _Context(model, types, sources, low, fp32_ops, pinned, kernels)
    ctx.homes = {name: FLOAT for name in sources}
    initializers = {t.name for t in model.graph.initializer}
    for value in model.graph.input:
        elem = value.type.tensor_type.elem_type
        is_retyped = elem == FLOAT and not keep_io_types and value.name not in initializers
        ctx.homes[value.name] = low if is_retyped else elem
    ctx.index_valued = {n for n, t in types.items() if t.elem_type in INDEX_TYPES}
    ctx.feeds_subgraph = outer_names_used_by_subgraphs(model.graph)
    model_opsets = opsets(model)
    plans: dict[str, NodePlan] = {}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] in sources:
            plans[node.name] = NodePlan(KEEP, "constant", frozenset(), frozenset())
            continue
        opset = model_opsets.get("" if node.domain == "ai.onnx" else node.domain, 1)
        sig, groups = node_groups(node, types, opset, low, ATTRIBUTE_TYPED_OPS)
        params = [(sig.input_param(i) if sig else None, n) for i, n in enumerate(node.input)]
        runtime_inputs = [n for _, n in params if n and n not in sources]
        if sig is None:
            has_float = any(types.get(n, _UNKNOWN).elem_type == FLOAT for n in list(node.input) + list(node.output) if n)
            plans[node.name] = NodePlan(FP32 if has_float else KEEP, "no operator schema", frozenset(), frozenset())
        else:
            plans[node.name] = _plan(ctx, node, params, runtime_inputs, groups)
        state, converts = plans[node.name].state, plans[node.name].converts
        is_beyond_low = ctx.reads_beyond_low(node, runtime_inputs)
        for index, name in enumerate(node.output):
            original = types.get(name, _UNKNOWN).elem_type
            is_low = sig is not None and sig.output_param(index) in converts and state in (LOW, EMULATED)
            ctx.homes[name] = low if is_low else original
            if original == FLOAT and ctx.is_index_computation(node, runtime_inputs):
                ctx.index_valued.add(name)
            if ctx.homes[name] == FLOAT and is_beyond_low:
                ctx.beyond_low.add(name)
    return plans, ctx.homes, ctx.beyond_low


def _plan(ctx: _Context, node, params, runtime_inputs, groups) -> NodePlan:
    convertible, free, unconvertible = groups
    converts = (convertible - free) | unconvertible
    state, reason = _decide(ctx, node, params, converts, runtime_inputs)
    if state == LOW and unconvertible:
        state, reason = EMULATED, f"the operator schema at this opset has no {_short(ctx.low)}"
    elif state == LOW and not _has_low_kernel(ctx, node, params, converts, free):
        state, reason = EMULATED, f"no {_short(ctx.low)} kernel in {_RUNTIME_NAMES[ctx.kernels]}"
    elif (state == KEEP and free and any(ctx.homes.get(n) == ctx.low for _, n in params)
          and not _has_reader(ctx, node, params, converts, free)):
        state, reason = FP32, f"no kernel reading {_short(ctx.low)} in {_RUNTIME_NAMES[ctx.kernels]}"
    return NodePlan(state, reason, converts, free)


_RUNTIME_NAMES = {"onnxruntime": "onnxruntime CPU", "infc-cpu": "infc's CPU runtime", "all": "the schema"}


def _has_low_kernel(ctx: _Context, node, params, converts, free) -> bool:
    if ctx.kernels == "infc-cpu":
        return node.domain in ("", "ai.onnx") and node.op_type in INFC_CPU_LOW_OPS[ctx.low]
    return ctx.kernels == "all" or _runs(ctx, node, params, converts, free)


def _has_reader(ctx: _Context, node, params, converts, free) -> bool:
    if ctx.kernels == "infc-cpu":
        return node.domain in ("", "ai.onnx") and node.op_type in INFC_CPU_READERS
    return ctx.kernels == "all" or _runs(ctx, node, params, converts, free)


def _decide(ctx: _Context, node, params, converts, runtime_inputs) -> tuple[str, str]:
    """The rules, in order: the first that applies decides."""
    if not converts:
        return KEEP, "no float values"
    if node.name in ctx.pinned:
        return FP32, "pinned"
    if node.op_type in ctx.fp32_ops:
        return FP32, ctx.fp32_ops[node.op_type]
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return FP32, "control flow: subgraphs are not converted"
    if any(o in ctx.feeds_subgraph for o in node.output):
        return FP32, "feeds a subgraph"
    for param, name in params:
        if param in converts and name in ctx.sources:
            reason = fits(ctx.sources[name], NUMPY_DTYPES[ctx.low])
            if reason:
                return FP32, reason
    if ctx.is_index_computation(node, runtime_inputs):
        return FP32, "computed from integers and small constants (positions, masks)"
    float_runtime = [n for p, n in params if p in converts and n and n not in ctx.sources]
    if node.op_type in FOLLOW_FP32_OPS and any(ctx.homes.get(n) == FLOAT for n in float_runtime):
        return FP32, "follows an fp32 input"
    return LOW, ""


def _runs(ctx: _Context, node, params, converts, free) -> bool:
    proposed = []
    for param, name in params:
        if not name:
            proposed.append(None)
            continue
        original = ctx.types.get(name, ValueType(FLOAT, None))
        elem = ctx.low if param in converts else (ctx.homes.get(name) if param in free else original.elem_type)
        proposed.append((elem, original.shape))
    if node.op_type in ATTRIBUTE_TYPED_OPS:
        node = retyped_attribute_node(node, ctx.low)
    return has_cpu_kernel(node, proposed, opsets(ctx.model), ctx.model.ir_version)


def _short(low: int) -> str:
    return type_string(low)[len("tensor("):-1]
