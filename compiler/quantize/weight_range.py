"""The range of int8 weight codes in QDQ models that onnxruntime's CPU kernels run exactly.

On x86 without VNNI, onnxruntime's (MLAS) u8 x s8 GEMM multiplies pairs of bytes into one int16
(vpmaddubsw), which saturates once a pair of products passes 32767: 255 * 127 * 2 = 64770 does.
Measured here (AMD EPYC, AVX2, onnxruntime 1.32): MatMulInteger of full-range int8 weights off by
57,566 of 236,444, and a QDQ CNN's QLinearConv output 6% off its own float QDQ arithmetic (0.4%).
Weights within [-64, 64] cannot saturate (255 * 64 * 2 = 32640), at the cost of one bit, as
onnxruntime's quantizer does with reduce_range. Where the CPU has VNNI (or is not x86) the kernels
sum in int32 and the full [-127, 127] stays.
"""

from __future__ import annotations

import platform

from ..target import cpu_model_and_all_flags

FULL, REDUCED = 127, 64
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")  # int8 dot products summed in int32


def saturates_u8s8() -> bool:
    """onnxruntime's u8 x s8 kernels on this CPU may saturate full-range weights."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return False
    return not any(flag in cpu_model_and_all_flags()[1] for flag in VNNI_FLAGS)


# the CLI's --int8-weights: what reduce_range each choice means (None: decided by this CPU)
CHOICES = {"auto": None, "8bit": False, "7bit": True}


def weight_limit(reduce_range: bool | None = None) -> int:
    """The largest weight code: reduced where asked, or (None) where this CPU's kernels saturate."""
    return REDUCED if (saturates_u8s8() if reduce_range is None else reduce_range) else FULL
