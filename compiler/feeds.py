"""Seeded random inputs for a model: dtype-aware, integer inputs in ranges the model can index."""

from __future__ import annotations

import numpy as np
import onnx

from .pinned_dims import pinned_dims
from .runtime.feeds_io import gather_table_rows, random_inputs

# Values for symbolic dims by what their names suggest; anything else gets DEFAULT_DIM.
DIM_HINTS = (("batch", 2), ("past", 3), ("seq", 7), ("len", 7), ("height", 64), ("width", 64))
DEFAULT_DIM = 32


def _resolve_dim(dim: onnx.TensorShapeProto.Dimension, known: dict[str, int], overrides: dict[str, int],
                 is_leading: bool = False) -> int:
    if dim.HasField("dim_value") and dim.dim_value > 0:
        return int(dim.dim_value)
    return _named_dim(dim.dim_param, known, overrides, is_leading)


def _named_dim(name: str, known: dict[str, int], overrides: dict[str, int], is_leading: bool) -> int:
    if name in overrides:
        return overrides[name]
    if name in known:
        return known[name]
    if "+" in name:
        # Optimum's attention mask is [batch, 'past_sequence_length + sequence_length']: each term
        # resolves as the dim it names, so the mask agrees with the past K/V given after it
        value = sum(int(t) if t.isdigit() else _named_dim(t, known, overrides, False)
                    for t in (t.strip() for t in name.split("+")))
    elif "total" in name.lower():
        # exporters' convention: total_sequence_length = past_sequence_length + sequence_length
        value = _past_dim(known) + _seq_dim(known)
    else:
        # a leading dim without a telling name ('N', 'unk__749', dynamo's 's0') is a batch: 32 images
        # of a 9-second clip made --verify of an audio model take 90 s
        default = DIM_HINTS[0][1] if is_leading else DEFAULT_DIM
        value = next((v for hint, v in DIM_HINTS if hint in name.lower()), default)
    if name:
        known[name] = value
    return value


def _past_dim(known: dict[str, int]) -> int:
    return next((v for k, v in known.items() if "past" in k.lower()), DIM_HINTS[1][1])


def _seq_dim(known: dict[str, int]) -> int:
    return next((v for k, v in known.items() if "seq" in k.lower() and "past" not in k.lower() and "total" not in k.lower()),
                DIM_HINTS[2][1])


def _resolution_order(inputs) -> list:
    # Dims named "total..." depend on the past and new lengths: resolve inputs carrying them last.
    def has_total(value):
        return any("total" in d.dim_param.lower() for d in value.type.tensor_type.shape.dim)

    return sorted(inputs, key=has_total)


def random_feeds(model: onnx.ModelProto, seed: int = 0, overrides: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    initializer_names = {t.name for t in model.graph.initializer}
    graph_inputs = [v for v in model.graph.input if v.name not in initializer_names]
    known: dict[str, int] = {}
    overrides = {**pinned_dims(model), **(overrides or {})}
    shapes = {v.name: [_resolve_dim(d, known, overrides, axis == 0 and len(v.type.tensor_type.shape.dim) >= 2)
                       for axis, d in enumerate(v.type.tensor_type.shape.dim)]
              for v in _resolution_order(graph_inputs)}
    inputs = [{"name": v.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name}
              for v in graph_inputs]
    steps = [{"op": n.op_type, "inputs": list(n.input)} for n in model.graph.node]
    rows = gather_table_rows(steps, {t.name: list(t.dims) for t in model.graph.initializer})
    return random_inputs(inputs, shapes, rows, seed)
