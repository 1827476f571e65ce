"""The device op table: (domain, op) -> op(inputs, attrs, ctx) over ctx.xp. An op may carry
`host_inputs` (input positions read on the host: shapes, axes) and `may_run(attrs)` (attribute
combinations it handles); steps it does not cover run the CPU kernel with host copies."""

from __future__ import annotations

from .cast_fold import ROUNDING
from .ops_attention import ATTENTION
from .ops_elementwise import ELEMENTWISE
from .ops_nn import NN
from .ops_paged import DECODER
from .ops_shape import SHAPE, VIEW_OPS  # noqa: F401 - VIEW_OPS: the arena plan reads it from here
from .ops_spatial import SPATIAL


def _merge(*tables):
    merged = {}
    for table in tables:
        for key, op in table.items():
            if key in merged:
                raise RuntimeError(f"device op {key} registered twice")
            merged[key] = op
    return merged


DEVICE_OPS = _merge(ELEMENTWISE, NN, SHAPE, ATTENTION, SPATIAL, ROUNDING, DECODER)


def device_op_for(domain: str, op: str, attrs: dict):
    fn = DEVICE_OPS.get(("" if domain in ("", "ai.onnx") else domain, op))
    if fn is None or not getattr(fn, "may_run", lambda a: True)(attrs):
        return None
    return fn
