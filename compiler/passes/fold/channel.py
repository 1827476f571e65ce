"""Reading a constant as one value per output channel of a Conv/Gemm-like producer."""

from __future__ import annotations

import numpy as np


def per_channel(value: np.ndarray | None, out_rank: int | None, num_channels: int, channel_axis: int = 1) -> np.ndarray | None:
    """`value` broadcast against an output of rank `out_rank` along `channel_axis`, as a vector of
    `num_channels`, or None when it varies along any other axis or would widen the output."""
    if value is None or value.dtype.kind != "f" or out_rank is None:
        return None
    if value.size == 1:
        return np.full(num_channels, value.reshape(()), dtype=value.dtype)
    if value.ndim > out_rank:
        return None
    shape = (1,) * (out_rank - value.ndim) + value.shape
    if shape[channel_axis] != num_channels or any(d != 1 for i, d in enumerate(shape) if i != channel_axis):
        return None
    return value.reshape(num_channels)


def out_channels(conv_op: str, w: np.ndarray, group: int) -> int:
    """Output channels of a Conv ([Cout, Cin/g, k...]) or ConvTranspose ([Cin, Cout/g, k...]) weight."""
    return w.shape[0] if conv_op == "Conv" else w.shape[1] * group


def scale_out_channels(conv_op: str, w: np.ndarray, scale: np.ndarray, group: int) -> np.ndarray:
    """The weight with each output channel's slice multiplied by `scale` (one value per channel)."""
    kernel = (1,) * (w.ndim - 2)
    if conv_op == "Conv":
        return w * scale.reshape((-1, 1) + kernel)
    grouped = w.reshape((group, w.shape[0] // group) + w.shape[1:])  # [g, Cin/g, Cout/g, k...]
    return (grouped * scale.reshape((group, 1, -1) + kernel)).reshape(w.shape)
