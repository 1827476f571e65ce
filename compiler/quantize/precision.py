"""fp16 / bf16 conversion of an ONNX model (optimized by infc or not) that onnxruntime runs on CPU.

Weights and activations are stored in the low precision; graph inputs and outputs keep their types
(Casts at the boundary) unless `keep_io_types=False`; the ops in `fp32_ops` compute in fp32; ops
that the target runtime (`kernels`, see fp32_ops.KERNEL_SETS) cannot run in that type compute in
fp32 between Casts, so the numerics stay those of the low-precision model (bf16 on ORT CPU is mostly
that).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field

import onnx

from ..errors import BadInput
from .emit import Emitter
from .fp32_ops import DEFAULT_FP32_OPS, KERNEL_SETS, LOW_PRECISIONS
from .graph_types import opsets, signature, value_types
from .model_parts import drop_unused, float_constants, named_nodes, set_metadata
from .opset_upgrade import ensure_opset
from .plan import EMULATED, FLOAT, FP32, LOW, plan_nodes

METADATA_KEY = "infc.precision"
# Cast, and so any bf16 value at all, exists from opset 13.
BF16_MIN_OPSET = 13


@dataclass
class PrecisionReport:
    precision: str
    num_nodes: int
    num_low: int  # nodes computing in the low precision
    num_emulated: int  # fp32 between low-precision Casts (no such kernel in onnxruntime CPU, or schema)
    num_casts: int
    fp32_nodes: list = field(default_factory=list)  # [node, op, reason]: pinned, or following fp32
    emulated_ops: dict = field(default_factory=dict)  # op -> count
    low_nodes: list = field(default_factory=list)  # names in topological order: what repair may pin
    notes: list = field(default_factory=list)  # e.g. an opset upgrade

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Prepared:
    """What conversion needs from the original, computed once (repair converts many times)."""
    model: onnx.ModelProto
    types: dict
    constants: dict
    notes: list

    @classmethod
    def of(cls, model: onnx.ModelProto, precision: str) -> Prepared:
        notes = []
        if precision == "bf16":
            model, note = ensure_opset(model, BF16_MIN_OPSET, "Cast to bfloat16")
            notes += [note] if note else []
        named = named_nodes(model)
        return cls(named, value_types(named), float_constants(named), notes)


def convert_precision(model: onnx.ModelProto | Prepared, precision: str, keep_io_types: bool = True,
                      fp32_ops: dict[str, str] | None = None, pinned=frozenset(),
                      kernels: str = "onnxruntime") -> tuple[onnx.ModelProto, PrecisionReport]:
    """The model in `precision` ("fp16" or "bf16") and what was kept in fp32 and why. `pinned`: node
    names to compute in fp32 (unnamed nodes are `<op>_<index>`), as `repair_precision` finds them."""
    if precision not in LOW_PRECISIONS:
        raise BadInput(f"--precision {precision}: expected one of {', '.join(LOW_PRECISIONS)}")
    if kernels not in KERNEL_SETS:
        raise BadInput(f"kernels '{kernels}': expected one of {', '.join(KERNEL_SETS)}")
    prepared = model if isinstance(model, Prepared) else Prepared.of(model, precision)
    low = LOW_PRECISIONS[precision]
    model_opsets = opsets(prepared.model)
    fp32_ops = DEFAULT_FP32_OPS if fp32_ops is None else fp32_ops
    types, constants = prepared.types, prepared.constants
    model = onnx.ModelProto()
    model.CopyFrom(prepared.model)
    plans, homes, beyond_low = plan_nodes(model, types, constants, low, keep_io_types, fp32_ops, set(pinned), kernels)
    emitter = Emitter(model, constants, homes, saturate=beyond_low)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] in constants:
            emitter.nodes.append(node)
            continue
        sig = signature(node.op_type, node.domain, model_opsets.get("" if node.domain == "ai.onnx" else node.domain, 1))
        emitter.emit(node, plans[node.name], sig, low, types)
    _retype_boundary(model, emitter, homes, low, keep_io_types)
    graph = model.graph
    del graph.node[:]
    graph.node.extend(emitter.nodes)
    graph.initializer.extend(emitter.initializers)
    drop_unused(graph)
    changed = {n for n, t in types.items() if homes.get(n, t.elem_type) != t.elem_type}
    kept_info = [v for v in graph.value_info if v.name not in changed]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    set_metadata(model, METADATA_KEY, json.dumps({"precision": precision, "keep_io_types": keep_io_types,
                                                  "fp32_ops": fp32_ops, "pinned": sorted(pinned), "kernels": kernels}))
    ops = {n.name: n.op_type for n in prepared.model.graph.node}
    report = PrecisionReport(
        precision, len(plans), sum(p.state == LOW for p in plans.values()), sum(p.state == EMULATED for p in plans.values()),
        emitter.num_casts, [[name, ops[name], p.reason] for name, p in plans.items() if p.state == FP32],
        dict(Counter(ops[name] for name, p in plans.items() if p.state == EMULATED)),
        [name for name, p in plans.items() if p.state in (LOW, EMULATED)], list(prepared.notes))
    if plans and not any(p.state in (LOW, EMULATED) for p in plans.values()) and any(
            t.data_type == onnx.TensorProto.FLOAT16 for t in prepared.model.graph.initializer):
        report.notes.append(f"nothing converted to {precision}: the model is already float16; --precision "
                            f"converts float32 values (the plan runs the model's own float16)")
    return model, report


def _retype_boundary(model, emitter: Emitter, homes, low, keep_io_types) -> None:
    initializers = {t.name for t in model.graph.initializer}
    for value in model.graph.input:
        if value.type.tensor_type.elem_type == FLOAT and not keep_io_types and value.name not in initializers:
            value.type.tensor_type.elem_type = low
    for value in model.graph.output:
        home, original = homes.get(value.name), value.type.tensor_type.elem_type
        wanted = low if original == FLOAT and not keep_io_types else original
        value.type.tensor_type.elem_type = wanted
        if home is None or home == wanted:
            continue
        # the producer writes a renamed value; a Cast writes the output name in the wanted type
        inner = emitter.fresh(f"{value.name}/inner")
        for node in emitter.nodes:
            node.output[:] = [inner if o == value.name else o for o in node.output]
            node.input[:] = [inner if i == value.name else i for i in node.input]
        emitter.nodes.append(onnx.helper.make_node("Cast", [inner], [value.name], name=emitter.fresh(f"{value.name}/cast"),
                                                   to=wanted))
        emitter.num_casts += 1
