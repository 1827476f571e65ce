"""Raise a model's default-domain opset when a reduced-precision form needs a newer op version
(Cast to bfloat16 and per-channel DequantizeLinear both arrive in opset 13)."""

from __future__ import annotations

import onnx
from onnx import version_converter

from ..errors import BadInput
from .graph_types import opsets


def ensure_opset(model: onnx.ModelProto, minimum: int, why: str) -> tuple[onnx.ModelProto, str | None]:
    """The model itself when its opset is new enough, else onnx's version converter's upgrade of it
    and a note for the report."""
    current = opsets(model).get("", 1)
    if current >= minimum:
        return model, None
    try:
        upgraded = version_converter.convert_version(model, minimum)
    except Exception as exc:  # noqa: BLE001 - the converter raises many kinds; one line for the user
        raise BadInput(f"{why} needs opset >= {minimum}; upgrading the model from opset {current} failed: "
                       f"{str(exc).splitlines()[0][:200]}") from None
    return upgraded, f"opset upgraded from {current} to {minimum}: {why}"
