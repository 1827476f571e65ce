"""Element types of every value (as onnxruntime infers them, contrib ops included) and each node's
type parameters (from onnxruntime's operator schemas: which inputs and outputs share a type `T`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import onnx

from ..errors import InfcError
from ..ort_env import require_onnxruntime

_TYPE_NAMES = {f"tensor({name})": value for name, value in (
    ("float", onnx.TensorProto.FLOAT), ("float16", onnx.TensorProto.FLOAT16), ("bfloat16", onnx.TensorProto.BFLOAT16),
    ("double", onnx.TensorProto.DOUBLE), ("int64", onnx.TensorProto.INT64), ("int32", onnx.TensorProto.INT32),
    ("int8", onnx.TensorProto.INT8), ("uint8", onnx.TensorProto.UINT8), ("bool", onnx.TensorProto.BOOL))}


@dataclass(frozen=True)
class ValueType:
    elem_type: int
    shape: tuple | None  # ints, dim names or None per dim; None when the rank is unknown


_UNKNOWN_TYPE = ValueType(0, None)


def value_types(model: onnx.ModelProto) -> dict[str, ValueType]:
    """Types of graph inputs, initializers and every node output of the main graph."""
    ort = require_onnxruntime()
    types = {t.name: ValueType(t.data_type, tuple(t.dims)) for t in model.graph.initializer}
    for value in model.graph.input:
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim)
        types[value.name] = ValueType(tensor.elem_type, dims if tensor.HasField("shape") else None)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    outputs = list(dict.fromkeys(o for n in model.graph.node for o in n.output if o))
    del probe.graph.output[:]
    # Untyped outputs: onnxruntime infers their types when it resolves the graph.
    probe.graph.output.extend(onnx.ValueInfoProto(name=name) for name in outputs)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - one line with ORT's reason
        raise InfcError(f"onnxruntime cannot load the model to infer its types: {str(exc).splitlines()[0][:200]}") from None
    for arg in session.get_outputs():
        if arg.type in _TYPE_NAMES:
            shape = tuple(d if isinstance(d, int) else (d or None) for d in arg.shape) if arg.shape is not None else None
            types[arg.name] = ValueType(_TYPE_NAMES[arg.type], shape)
    return types


@dataclass(frozen=True)
class Signature:
    inputs: tuple[str, ...]  # per position: a type parameter ("T") or a fixed type ("tensor(float)")
    outputs: tuple[str, ...]
    allowed: dict  # type parameter -> allowed type strings

    def input_param(self, index: int) -> str | None:
        return self.inputs[min(index, len(self.inputs) - 1)] if self.inputs else None

    def output_param(self, index: int) -> str | None:
        return self.outputs[min(index, len(self.outputs) - 1)] if self.outputs else None


@functools.lru_cache(maxsize=1)
def _schemas() -> dict:
    from onnxruntime.capi.onnxruntime_pybind11_state import get_all_operator_schema

    found: dict = {}
    for schema in get_all_operator_schema():
        found.setdefault((schema.domain, schema.name), []).append(schema)
    return found


def signature(op_type: str, domain: str, opset: int) -> Signature | None:
    """The schema in force at `opset` (the newest with since_version <= opset); None if unknown."""
    versions = [s for s in _schemas().get(("" if domain == "ai.onnx" else domain, op_type), ()) if s.since_version <= opset]
    if not versions:
        return None
    schema = max(versions, key=lambda s: s.since_version)
    return Signature(tuple(p.typeStr for p in schema.inputs), tuple(p.typeStr for p in schema.outputs),
                     {c.type_param_str: tuple(c.allowed_type_strs) for c in schema.type_constraints})


def opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}


def type_string(elem_type: int) -> str:
    return next(name for name, value in _TYPE_NAMES.items() if value == elem_type)


def node_groups(node: onnx.NodeProto, types: dict[str, ValueType], opset: int, low: int, attribute_typed_ops):
    """(signature, (convertible, free, unconvertible) float type params), or (None, None) without a schema.
    Free: a lone input's parameter (Shape's T, Cast's T1), any float type will do. A parameter of
    outputs only is retyped through an attribute, so only for `attribute_typed_ops`."""
    sig = signature(node.op_type, node.domain, opset)
    if sig is None:
        return None, None
    members: dict[str, list] = {}
    for index, name in enumerate(node.input):
        if name:
            members.setdefault(sig.input_param(index), []).append(("in", name))
    for index, name in enumerate(node.output):
        if name:
            members.setdefault(sig.output_param(index), []).append(("out", name))
    is_float = {p for p, m in members.items()
                if any(types.get(n, _UNKNOWN_TYPE).elem_type == onnx.TensorProto.FLOAT for _, n in m)}
    convertible = {p for p in is_float if type_string(low) in sig.allowed.get(p, ())}
    free = {p for p in convertible if [k for k, _ in members[p]] == ["in"]}
    attribute_typed = {p for p in convertible if all(k == "out" for k, _ in members[p])}
    if attribute_typed and node.op_type not in attribute_typed_ops:
        convertible -= attribute_typed  # e.g. RandomNormal's dtype: left as it is
    return sig, (frozenset(convertible), frozenset(free), frozenset(is_float - convertible))
