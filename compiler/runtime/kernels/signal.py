"""Signal processing: DFT (forward, inverse, one-sided), STFT, the Hann / Hamming / Blackman windows and
MelWeightMatrix. Complex values travel as a trailing axis of size 2 (real, imaginary)."""

from __future__ import annotations

import numpy as np

from .common import arg, norm_axis, np_dtype


def _complex(x: np.ndarray) -> np.ndarray:
    """[..., 1] real or [..., 2] (re, im) -> complex array without the trailing axis."""
    return x[..., 0].astype(np.complex128) if x.shape[-1] == 1 else x[..., 0] + 1j * x[..., 1]


def _pack(z: np.ndarray, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype in _COMPLEX_OF:  # a complex array's memory already is (re, im) pairs: one cast, no stack
        pairs = np.ascontiguousarray(z, dtype=_COMPLEX_OF[dtype]).view(dtype)
        return pairs.reshape(z.shape + (2,))
    return np.stack([z.real, z.imag], axis=-1).astype(dtype)


_COMPLEX_OF = {np.dtype(np.float32): np.complex64, np.dtype(np.float64): np.complex128}


def dft(inputs, attrs, ctx):
    x = inputs[0]
    length = arg(inputs, 1)
    if ctx.opset >= 20:
        axis = int(arg(inputs, 2).reshape(-1)[0]) if arg(inputs, 2) is not None else -2
    else:
        axis = attrs.get("axis", 1)
    axis = norm_axis(axis, x.ndim)
    inverse, onesided = attrs.get("inverse", 0), attrs.get("onesided", 0)
    if length is not None and length.size:
        n = int(length.reshape(-1)[0])
    else:
        n = 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
    signal = _complex(x)
    if inverse:
        if onesided:
            return [np.fft.irfft(signal, n=n, axis=axis)[..., None].astype(x.dtype)]
        return [_pack(np.fft.ifft(signal, n=n, axis=axis), x.dtype)]
    result = np.fft.fft(signal, n=n, axis=axis)
    if onesided:
        result = np.take(result, np.arange(n // 2 + 1), axis=axis)
    return [_pack(result, x.dtype)]


def stft(inputs, attrs, ctx):
    x, step = inputs[0], int(inputs[1].reshape(-1)[0])
    if x.ndim == 2:  # [batch, length]: a real signal without its trailing axis (torch.stft's export; onnxruntime takes it)
        x = x[..., None]
    window, length = arg(inputs, 2), arg(inputs, 3)
    frame = int(length.reshape(-1)[0]) if length is not None else (window.shape[0] if window is not None else x.shape[-2])
    window = window if window is not None else np.ones(frame, dtype=x.dtype)
    frames = 1 + (x.shape[-2] - frame) // step
    is_onesided = bool(attrs.get("onesided", 1))
    if x.shape[-1] == 1:
        # a real signal (every exported torch.stft): its frames are strided views, windowed in float64,
        # and a one-sided spectrum is an rfft (a complex copy of the signal, a gather of complex frames
        # and a full fft took 3x onnxruntime's time on a 16k-sample batch)
        windows = np.lib.stride_tricks.sliding_window_view(x[..., 0], frame, axis=-1)[:, ::step][:, :frames]
        pieces = windows * window.astype(np.float64)  # (batch, frames, frame)
        result = np.fft.rfft(pieces, axis=-1) if is_onesided else np.fft.fft(pieces, axis=-1)
        return [_pack(result, x.dtype)]
    signal = _complex(x)  # (batch, length)
    starts = np.arange(frames) * step
    pieces = signal[:, starts[:, None] + np.arange(frame)[None, :]] * window  # (batch, frames, frame)
    result = np.fft.fft(pieces, n=frame, axis=-1)
    if is_onesided:
        result = result[..., :frame // 2 + 1]
    return [_pack(result, x.dtype)]


def _window(kind):
    def kernel(inputs, attrs, ctx):
        size = int(inputs[0].reshape(-1)[0])
        dtype = np_dtype(attrs.get("output_datatype", 1))
        denominator = size if attrs.get("periodic", 1) else size - 1
        phase = np.arange(size) * (2 * np.pi / denominator)
        if kind == "hann":
            w = np.sin(phase / 2) ** 2
        elif kind == "hamming":
            w = 25 / 46 - np.cos(phase) * (21 / 46)
        else:
            w = 0.42 - 0.5 * np.cos(phase) + 0.08 * np.cos(2 * phase)
        return [w.astype(dtype)]
    return kernel


def mel_weight_matrix(inputs, attrs, ctx):
    bins, length, rate, low, high = (np.asarray(v).reshape(-1)[0] for v in inputs[:5])
    bins, length, rate = int(bins), int(length), int(rate)
    to_mel = lambda hz: 2595 * np.log1p(hz / 700) / np.log(10)  # noqa: E731
    points = np.arange(bins + 2) * ((to_mel(float(high)) - to_mel(float(low))) / (bins + 2)) + to_mel(float(low))
    edges = (((length + 1) * (700 * np.expm1(points / 2595 * np.log(10)))) // rate).astype(int)
    out = np.zeros((length // 2 + 1, bins))
    for i in range(bins):
        left, center, right = edges[i], edges[i + 1], edges[i + 2]
        if center == left:
            out[center, i] = 1
        else:
            out[left:center + 1, i] = (np.arange(left, center + 1) - left) / (center - left)
        if right != center:
            out[center:right, i] = (right - np.arange(center, right)) / (right - center)
    return [out.astype(np_dtype(attrs.get("output_datatype", 1)))]


KERNELS = {
    ("", "DFT"): dft,
    ("", "STFT"): stft,
    ("", "HannWindow"): _window("hann"),
    ("", "HammingWindow"): _window("hamming"),
    ("", "BlackmanWindow"): _window("blackman"),
    ("", "MelWeightMatrix"): mel_weight_matrix,
}
