"""Write the converted graph from the plan: retyped copies of constants, and Casts (one per value
and type, shared by its consumers) where a value's home type differs from what a node computes in."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .fp32_ops import ATTRIBUTE_TYPED_OPS, NUMPY_DTYPES, largest_finite, retyped_attribute_node
from .graph_types import opsets
from .plan import EMULATED, FLOAT, KEEP, LOW

_SUFFIX = {onnx.TensorProto.FLOAT: "fp32", onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.BFLOAT16: "bf16"}


class Emitter:
    def __init__(self, model: onnx.ModelProto, sources: dict[str, np.ndarray], homes: dict[str, int],
                 saturate: set[str] = frozenset()):
        """`saturate`: fp32 values whose Casts to a low type clip to its largest finite first (plan.py)."""
        self.sources, self.homes, self.saturate = sources, homes, saturate
        self._opset = opsets(model).get("", 1)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._casts: dict[tuple[str, int], str] = {}
        graph = model.graph
        self._taken = ({n.name for n in graph.node} | set(homes) | {t.name for t in graph.initializer}
                       | {name for n in graph.node for name in list(n.input) + list(n.output)})
        self.num_casts = 0

    def fresh(self, hint: str) -> str:
        name, k = hint, 0
        while name in self._taken:
            k += 1
            name = f"{hint}_{k}"
        self._taken.add(name)
        return name

    def present(self, name: str, elem: int) -> str:
        """`name` as a value of type `elem`: itself, a retyped constant, or the output of a (shared) Cast."""
        if name in self.sources and elem != FLOAT:
            key = (name, elem)
            if key not in self._casts:
                values = self.sources[name].astype(NUMPY_DTYPES[elem])
                self._casts[key] = self.fresh(f"{name}/{_SUFFIX[elem]}")
                self.initializers.append(numpy_helper.from_array(values, self._casts[key]))
            return self._casts[key]
        if self.homes.get(name, elem) == elem:
            return name
        return self.cast(name, elem)

    def cast(self, name: str, elem: int) -> str:
        key = (name, elem)
        if key not in self._casts:
            source = self._saturated(name, elem) if name in self.saturate and elem != FLOAT else name
            self._casts[key] = self.fresh(f"{name}/{_SUFFIX.get(elem, elem)}")
            self.nodes.append(helper.make_node("Cast", [source], [self._casts[key]], name=self.fresh(f"{name}/cast"), to=elem))
            self.num_casts += 1
        return self._casts[key]

    def _saturated(self, name: str, elem: int) -> str:
        """`name` clipped to the range of `elem`: float32's lowest becomes fp16's, as an fp16 model fills masks."""
        limit = largest_finite(NUMPY_DTYPES[elem])
        out = self.fresh(f"{name}/saturated")
        if self._opset >= 11:  # Clip's bounds are inputs from opset 11
            bounds = [self.fresh(f"{name}/lowest"), self.fresh(f"{name}/largest")]
            self.initializers += [numpy_helper.from_array(np.array(v, np.float32), b) for v, b in zip((-limit, limit), bounds)]
            node = helper.make_node("Clip", [name, *bounds], [out], name=self.fresh(f"{name}/saturate"))
        else:
            node = helper.make_node("Clip", [name], [out], name=self.fresh(f"{name}/saturate"), min=-limit, max=limit)
        self.nodes.append(node)
        return out

    def emit(self, node: onnx.NodeProto, plan, sig, low: int, types) -> None:
        out = onnx.NodeProto()
        out.CopyFrom(retyped_attribute_node(node, low) if plan.state == LOW and node.op_type in ATTRIBUTE_TYPED_OPS else node)
        for index, name in enumerate(node.input):
            if not name:
                continue
            param = sig.input_param(index) if sig else None
            if param in plan.free and plan.state in (LOW, KEEP):
                continue
            original = types[name].elem_type if name in types else None
            if param in plan.converts and plan.state == LOW:
                out.input[index] = self.present(name, low)
            elif (param in plan.converts or param in plan.free) and plan.state == EMULATED:
                # round to the low precision as a real low-precision model would, compute in fp32
                rounded = self.present(name, low)
                out.input[index] = self.cast(rounded, FLOAT)
            elif original is not None:
                out.input[index] = self.present(name, original)
        casts_after = []
        if plan.state == EMULATED:
            for index, name in enumerate(node.output):
                if name and sig.output_param(index) in plan.converts:
                    out.output[index] = self.fresh(f"{name}/fp32")
                    casts_after.append(helper.make_node("Cast", [out.output[index]], [name],
                                                        name=self.fresh(f"{name}/cast"), to=low))
        self.nodes.append(out)
        self.nodes.extend(casts_after)
        self.num_casts += len(casts_after)
