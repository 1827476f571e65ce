"""Why an op the ONNX checker does not know is there, in one line that names every such op.

The checker stops at the first unknown op with "No Op registered for X with domain_version of N",
which reads like an infc limitation. Converters leave two kinds behind: an op of a later opset than
the model imports (tf2onnx writes HardSwish for TFLite's HARD_SWISH even at --opset 13; HardSwish
is opset 14), and an op no runtime defines (tf2onnx keeps a TFLite custom op it cannot convert as a
node named after it, TFL_Convolution2DTransposeBias in mediapipe's selfie segmentation, three
TFL_Landmarks2TransformMatrix-like ops in its face landmarks with attention). Each wants another
fix, so the message says which kind each op is.
"""

from __future__ import annotations

import functools

import onnx

MAX_NAMED = 4  # ops named in the message; the rest are counted


@functools.cache
def _first_opsets() -> dict[str, int]:
    """ONNX-domain op -> the opset that first defines it (onnx's own schemas)."""
    first: dict[str, int] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain in ("", "ai.onnx"):
            first[schema.name] = min(first.get(schema.name, schema.since_version), schema.since_version)
    return first


def unknown_ops_message(model: onnx.ModelProto, is_known) -> str | None:
    """The checker's unknown-op refusal said plainly: each op of the ONNX domain that `is_known(op,
    opset)` rejects, with its node and what would make it known; None if there is none."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        return None
    later, foreign = {}, {}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or is_known(node.op_type, opset):
            continue
        since = _first_opsets().get(node.op_type)
        if since is not None and since > opset:
            later.setdefault(node.op_type, (node.name or node.output[0], since))
        else:
            foreign.setdefault(node.op_type, node.name or node.output[0])
    if not later and not foreign:
        return None
    parts = []
    if later:
        named = [f"{op} (node '{name}') is ONNX only from opset {since}" for op, (name, since) in list(later.items())[:MAX_NAMED]]
        parts.append("; ".join(named) + f" and the model imports opset {opset}: convert it at opset "
                     f"{max(s for _, s in later.values())} or later (tf2onnx: --opset)")
    if foreign:
        names = [f"{op} (node '{name}')" for op, name in list(foreign.items())[:MAX_NAMED]]
        more = f" and {len(foreign) - MAX_NAMED} more" if len(foreign) > MAX_NAMED else ""
        what = ("is neither an ONNX op nor an onnxruntime one: the converter left it" if len(foreign) == 1 else
                "are neither ONNX ops nor onnxruntime ones: the converter left them")
        parts.append(f"{', '.join(names)}{more} {what} unconverted (tf2onnx keeps a TFLite custom op it cannot "
                     "convert as a node of that name); infc cannot run it")
    return "; ".join(parts)
