"""The quantize pass group: fp16/bf16 with fp32 islands and self-repair, INT8 QDQ (docs/quantization.md).

The CLI calls `apply_precision`; the pieces are `convert_precision`, `repair_precision`,
`quantize_int8` and `iter_calibration`.
"""

from .api import apply_precision
from .calib_data import iter_calibration
from .int8 import quantize_int8
from .precision import convert_precision
from .repair import repair_precision

__all__ = ["apply_precision", "convert_precision", "iter_calibration", "quantize_int8", "repair_precision"]
