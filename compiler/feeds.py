"""Seeded random inputs for a model: dtype-aware, integer inputs in ranges the model can index."""

from __future__ import annotations

import re

import numpy as np
import onnx

# Values for symbolic dims by what their names suggest; anything else gets DEFAULT_DIM.
DIM_HINTS = (("batch", 2), ("past", 3), ("seq", 7), ("len", 7), ("height", 64), ("width", 64))
DEFAULT_DIM = 32


def _int_range_for(model: onnx.ModelProto, name: str) -> tuple[int, int]:
    """Indices into a Gather table stay below the table's first dim; masks are 0/1."""
    initializers = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == name and node.input[0] in initializers:
            return 0, int(initializers[node.input[0]].dims[0])
    if "mask" in name.lower():
        return 1, 2
    return 0, 2


def _resolve_dim(dim: onnx.TensorShapeProto.Dimension, known: dict[str, int], overrides: dict[str, int]) -> int:
    if dim.HasField("dim_value") and dim.dim_value > 0:
        return int(dim.dim_value)
    name = dim.dim_param
    if name in overrides:
        return overrides[name]
    if name in known:
        return known[name]
    terms = [t.strip() for t in re.split(r"\+", name)] if "+" in name else []
    if terms and all(t in known or t.isdigit() for t in terms):
        value = sum(known[t] if t in known else int(t) for t in terms)
    elif "total" in name.lower():
        # exporters' convention: total_sequence_length = past_sequence_length + sequence_length
        value = _past_dim(known) + _seq_dim(known)
    else:
        value = next((v for hint, v in DIM_HINTS if hint in name.lower()), DEFAULT_DIM)
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
    rng = np.random.default_rng(seed)
    initializer_names = {t.name for t in model.graph.initializer}
    known: dict[str, int] = {}
    feeds = {}
    for value in _resolution_order(model.graph.input):
        if value.name in initializer_names:
            continue
        tensor_type = value.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        shape = [_resolve_dim(d, known, overrides or {}) for d in tensor_type.shape.dim]
        if "position" in value.name.lower() and np.issubdtype(dtype, np.integer) and shape:
            feeds[value.name] = np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
        elif np.issubdtype(dtype, np.integer):
            low, high = _int_range_for(model, value.name)
            feeds[value.name] = rng.integers(low, high, size=shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[value.name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    return {value.name: feeds[value.name] for value in model.graph.input if value.name in feeds}
