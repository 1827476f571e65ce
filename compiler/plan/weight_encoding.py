"""Weights stored in fewer bytes than their type where that loses nothing.

    float32 weight whose every value is a bfloat16 (low 16 bits zero)  ==>  its high halves, uint16
    table entry: {"dtype": "float32", "encoding": "bf16_high_half", ...}; widened back at load

Why: a bf16 plan's weights are fp32 arrays rounded to bf16 (the emulated GEMMs and the non-GEMM
readers compute in fp32 from them), and a bfloat16 export served in float32 is widened exactly; both
stored as float32 cost twice the bytes they hold (a ViT-B/16 bf16 plan was larger than its fp32
plan). Widening is exact (a shift), so the loaded weight is the same array bit for bit. Plans that
use an encoding need format version 2 to be read (plan/format.py): an older infc refuses them
instead of reading the halves as float32.
"""

from __future__ import annotations

import numpy as np

BF16_HIGH_HALF = "bf16_high_half"
MIN_ELEMENTS = 1024  # smaller weights are not worth a pass at load


def encode(array: np.ndarray) -> tuple[np.ndarray, str | None]:
    """(the bytes to store, the encoding's name or None when the array is stored as it is)."""
    if array.dtype != np.float32 or array.size < MIN_ELEMENTS:
        return array, None
    bits = np.ascontiguousarray(array).reshape(-1).view(np.uint32)
    low = np.uint32(0xFFFF)
    if np.any(bits[:256] & low) or np.any(bits & low):  # an fp32 weight fails on its first values: no full pass
        return array, None
    return (bits >> np.uint32(16)).astype(np.uint16), BF16_HIGH_HALF


def stored_itemsize(info: dict) -> int | None:
    """Bytes per element in the section for a table entry's encoding (None: the dtype's own)."""
    return 2 if info.get("encoding") == BF16_HIGH_HALF else None


def decode(stored: np.ndarray, info: dict) -> np.ndarray:
    """The weight from its stored elements (uint16 halves for BF16_HIGH_HALF)."""
    if info.get("encoding") != BF16_HIGH_HALF:
        return stored
    return (stored.astype(np.uint32) << np.uint32(16)).view(np.float32)


def known(info: dict) -> bool:
    return info.get("encoding") in (None, BF16_HIGH_HALF)
