"""Convolutions as per-tap products of a shifted input on AMX-BF16 tiles (runtime/kernels/amx_taps.py).

The layout (stride phases of channel-pair words, each tap an offset into them) is checked on every
CPU: the conversion against NumPy (it needs numba only), the offsets by doing the taps' products in
float64 from the converted words. The tiles themselves run where the CPU has AMX-BF16, against a
float64 convolution of the same bf16-valued operands."""

from __future__ import annotations

import numpy as np
import pytest

from infc.compiler.runtime import amx_gemm, bf16_gemm, jit
from infc.compiler.runtime.kernels import amx_taps
from infc.compiler.runtime.kernels.conv import conv_forward, geometry

RTOL = 2e-6  # float32 sums of the same exact products in another order

# (x shape, w shape, attrs): strides, dilations, both at once, uneven pads, 1-D and 3-D, channels that
# are not a tile step, kernels past the strides, and sizes that cut every 32 x 32 block short
CASES = [
    ((1, 64, 19, 23), (5, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 64, 14, 14), (40, 64, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 64, 9, 9), (96, 64, 1, 1), {"strides": [2, 2]}),
    ((1, 40, 12, 10), (70, 40, 3, 3), {"dilations": [2, 2], "pads": [2, 1, 2, 1]}),
    ((1, 128, 7, 7), (256, 128, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 64, 40, 40), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((3, 32, 50), (12, 32, 5), {"pads": [2, 2], "strides": [3]}),
    ((1, 32, 5, 6, 7), (6, 32, 3, 2, 3), {"pads": [1, 0, 1, 1, 1, 1]}),
    ((1, 1024, 5, 5), (40, 1024, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 64, 9, 9), (16, 64, 2, 2), {"strides": [3, 3]}),
    ((1, 62, 9, 11), (16, 62, 3, 3), {"strides": [2, 2], "dilations": [2, 2], "pads": [1, 2, 3, 0]}),
    ((1, 64, 15, 15), (33, 64, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    ((1, 64, 3, 40), (70, 64, 3, 3), {}),  # one output row: split by output channels
    ((1, 64, 2, 9), (16, 64, 3, 3), {"pads": [4, 1, 4, 1]}),  # output rows that read only padding
]


def _operands(x_shape, w_shape, seed=0):
    rng = np.random.default_rng(seed)
    x = bf16_gemm.bf16_values(rng.standard_normal(x_shape).astype(np.float32))
    w = bf16_gemm.bf16_values((rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32))
    return x, w


def _layout(x_shape, w_shape, attrs):
    attrs = {"kernel_shape": list(w_shape[2:]), **attrs}
    geo = geometry(x_shape[2:], w_shape[2:], attrs)
    return attrs, geo, amx_taps.TapLayout(x_shape[2:], w_shape[2:], geo.strides, geo.dilations, geo.pads_begin,
                                          geo.pads_end, geo.out)


def _tap(x, w, geo, memo):
    return amx_taps.tap_conv(x, w, geo.strides, geo.dilations, geo.pads_begin, geo.pads_end, geo.out, memo)


def _error(y, reference):
    return float(np.abs(y - reference).max() / max(np.abs(reference).max(), 1e-30))


def _numpy_words(image, layout, pairs):
    """The phase words of one image [C, *spatial] built with NumPy slicing (the kernel's reference)."""
    x3 = image.reshape((image.shape[0],) + (1,) * (4 - image.ndim) + image.shape[1:])
    pads = [(0, 2 * pairs - x3.shape[0])] + [
        (int(b), int(g * s - d - b)) for b, g, s, d in zip(layout.pads, layout.grid, layout.strides, x3.shape[1:])]
    xp = np.pad(x3, pads)
    bits = xp.view(np.uint32) >> 16  # bf16 values: the low half of each float is zero
    words = np.zeros((pairs, layout.phases.size, layout.row_length), np.uint32)
    s1, s2, s3 = (int(s) for s in layout.strides)
    for slot, phase in enumerate(layout.phases):
        p1, p2, p3 = np.unravel_index(phase, (s1, s2, s3))
        plane = bits[:, p1::s1, p2::s2, p3::s3].reshape(2 * pairs, -1)
        words[:, slot, :plane.shape[1]] = plane[0::2] | (plane[1::2] << 16)
    return words


@pytest.mark.parametrize("x_shape,w_shape,attrs", CASES)
def test_phases_hold_the_padded_input_as_channel_pairs(x_shape, w_shape, attrs):
    if not jit.enabled():
        pytest.skip("compiled kernels are off")
    x, _ = _operands(x_shape, w_shape)
    _, _, layout = _layout(x_shape, w_shape, attrs)
    pairs = amx_taps.channel_pairs(x_shape[1])
    words = np.full((pairs, layout.phases.size, layout.row_length), 0xDEADBEEF, np.uint32)
    x4 = x[0].reshape((x_shape[1],) + (1,) * (5 - len(x_shape)) + x_shape[2:]).view(np.uint32)
    amx_taps._phase_pairs.get()(x4, layout.pads, layout.strides, layout.grid, layout.phases, 0, pairs, words)
    np.testing.assert_array_equal(words, _numpy_words(x[0], layout, pairs))


@pytest.mark.parametrize("x_shape,w_shape,attrs", CASES)
def test_each_tap_reads_its_windows_at_its_offset(x_shape, w_shape, attrs):
    """The taps' products done in float64 from the phase words, at the layout's offsets, and compacted
    as the kernel's output is, give the convolution: the layout alone, on any CPU."""
    x, w = _operands(x_shape, w_shape)
    attrs, _, layout = _layout(x_shape, w_shape, attrs)
    pairs = amx_taps.channel_pairs(x_shape[1])
    words = _numpy_words(x[0], layout, pairs).reshape(pairs, -1)
    values = np.empty((2 * pairs, words.shape[1]), np.float64)
    values[0::2] = (words << 16).view(np.float32)
    values[1::2] = (words & 0xFFFF0000).view(np.float32)
    m, c = w_shape[:2]
    by_tap = w.reshape(m, c, -1).astype(np.float64)
    sums = np.zeros((m, layout.columns))
    for tap, offset in enumerate(layout.offsets):
        sums += by_tap[:, :, tap] @ values[:c, offset:offset + layout.columns]
    y = np.lib.stride_tricks.as_strided(sums, (m,) + layout.out_dims, (layout.columns * 8,) + tuple(
        8 * s for s in layout.out_strides))
    reference = conv_forward(x[:1].astype(np.float64), w.astype(np.float64), None, attrs)[0]
    assert _error(y, reference) <= 1e-12


def _tiles_or_skip():
    if not (amx_gemm.has_amx_bf16() and jit.enabled()):
        pytest.skip("this CPU has no usable AMX-BF16 (or compiled kernels are off)")


@pytest.mark.parametrize("x_shape,w_shape,attrs", CASES)
def test_tap_convolution_matches_float64(x_shape, w_shape, attrs):
    _tiles_or_skip()
    x, w = _operands(x_shape, w_shape)
    attrs, geo, _ = _layout(x_shape, w_shape, attrs)
    reference = conv_forward(x.astype(np.float64), w.astype(np.float64), None, attrs)
    memo = {}
    y = _tap(x, w, geo, memo)
    assert y.dtype == np.float32 and y.shape == reference.shape
    assert _error(y, reference) <= RTOL
    np.testing.assert_array_equal(_tap(x, w, geo, memo), y)  # the cached weight and layout


@pytest.mark.parametrize("split_macs", [0, 1 << 62])
@pytest.mark.parametrize("case", [1, 4, 5, 6, 7, 11, 12, 13])
def test_either_core_split_gives_the_same_bits(monkeypatch, split_macs, case):
    """Output rows (or channels) split between the cores, or none: each output's sum is the same chain."""
    _tiles_or_skip()
    x_shape, w_shape, attrs = CASES[case]
    x, w = _operands(x_shape, w_shape)
    attrs, geo, _ = _layout(x_shape, w_shape, attrs)
    alone = _tap(x, w, geo, {})
    monkeypatch.setattr(amx_taps, "SPLIT_MIN_MACS", split_macs)
    np.testing.assert_array_equal(_tap(x, w, geo, {}), alone)


def test_images_do_not_depend_on_the_batch():
    _tiles_or_skip()
    x, w = _operands((3, 64, 20, 20), (48, 64, 3, 3))
    attrs, geo, _ = _layout(x.shape, w.shape, {"pads": [1, 1, 1, 1]})
    whole = _tap(x, w, geo, {})
    np.testing.assert_array_equal(whole[1:2], _tap(x[1:2], w, geo, {}))


def test_which_convolutions_go_by_taps():
    assert amx_taps.applies(64, (3, 3)) and amx_taps.applies(30, (5,)) and amx_taps.applies(96, (3, 1, 3))
    assert not amx_taps.applies(256, (1, 1))  # its windows are the input: amx_conv packs them as fast
    assert not amx_taps.applies(3, (7, 7))  # an RGB stem: 3 channels padded to 32
    assert not amx_taps.applies(40, (3, 3))  # 40 -> 64 channels: too much padding


def test_conv_forward_takes_the_taps_where_they_apply():
    _tiles_or_skip()
    x, w = _operands((1, 64, 12, 12), (32, 64, 3, 3))
    bias = np.arange(32, dtype=np.float32)
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    memo = {}
    y = conv_forward(x, w, bias, attrs, memo=memo, tiles=True)
    assert any(isinstance(key, tuple) and key[0] == "amx-taps-weight" for key in memo)
    reference = conv_forward(x.astype(np.float64), w.astype(np.float64), bias.astype(np.float64), attrs)
    assert _error(y, reference) <= RTOL
