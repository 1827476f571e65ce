"""Symbolic input dims whose value the model's own ops fix, for made-up feeds.

onnxruntime-genai's model builder leaves the past K/V head size symbolic ('kv_cache_dim') though
GroupQueryAttention accepts only the head size its projections make: feeds at any other value
fail to run, so `optimize --verify` on such a model could not start.
"""

from __future__ import annotations

import onnx

KV_AXES = (1, 3)  # [batch, KV heads, past length, head size]


def pinned_dims(model: onnx.ModelProto) -> dict[str, int]:
    """dim name -> the value the model's ops require."""
    from .decoder.genai_export import is_genai_export, past_kv_shapes

    if not is_genai_export(model):
        return {}
    shapes = past_kv_shapes(model)
    pinned = {}
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if value.name in shapes and len(dims) == 4:
            for axis, size in zip(KV_AXES, shapes[value.name]):
                if dims[axis].dim_param:
                    pinned[dims[axis].dim_param] = size
    return pinned
