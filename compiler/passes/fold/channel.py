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
