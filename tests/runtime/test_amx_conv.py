"""Convolutions on AMX-BF16 tiles (runtime/kernels/amx_conv.py) against a float64 convolution of the
same bf16-valued operands: 1-3 spatial dims, strides, dilations, pads, channels and pixels that cut
every tile and panel short, batches, and the two ways a convolution is split between the cores. The
window packing is checked on every CPU (it needs numba only); the tiles where the CPU has AMX-BF16.
Without it (or under `bf16_gemm.disabled()`) a step marked for tiles runs its float32 kernel.
Convolutions that amx_taps.py would take are kept on the windows here (test_amx_taps.py covers those)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from infc.compiler.runtime import amx_gemm, bf16_gemm, jit
from infc.compiler.runtime.kernels import amx_conv, amx_taps
from infc.compiler.runtime.kernels.common import KernelContext
from infc.compiler.runtime.kernels.conv import conv_forward, fused_conv, geometry, padded

RTOL = 2e-6  # float32 sums of the same exact products in another order

# (x shape, w shape, attrs)
CASES = [
    ((1, 3, 19, 23), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),  # K = 27 (one pair short), 437 pixels
    ((2, 16, 14, 14), (40, 16, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # strided, batch 2
    ((1, 64, 9, 9), (96, 64, 1, 1), {}),  # pointwise: one panel and a half
    ((1, 33, 12, 10), (70, 33, 3, 3), {"dilations": [2, 2], "pads": [2, 1, 2, 1]}),  # dilated, uneven pads
    ((1, 128, 7, 7), (256, 128, 3, 3), {"pads": [1, 1, 1, 1]}),  # one panel, large M: rows split
    ((1, 64, 40, 40), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),  # many panels: columns split
    ((3, 10, 50), (12, 10, 5), {"pads": [2, 2], "strides": [3]}),  # 1-D
    ((1, 4, 5, 6, 7), (6, 4, 3, 2, 3), {"pads": [1, 0, 1, 1, 1, 1]}),  # 3-D
    ((1, 1024, 5, 5), (40, 1024, 3, 3), {"pads": [1, 1, 1, 1]}),  # K = 9,216: more than one K block of the tiles
    ((1, 8, 9, 9), (16, 8, 2, 2), {"strides": [3, 3]}),  # strides past the kernel: inputs skipped
]


@pytest.fixture(autouse=True)
def _windows_only(monkeypatch):
    monkeypatch.setattr(amx_taps, "applies", lambda *_: False)


def _operands(x_shape, w_shape, seed=0):
    rng = np.random.default_rng(seed)
    x = bf16_gemm.bf16_values(rng.standard_normal(x_shape).astype(np.float32))
    w = bf16_gemm.bf16_values((rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32))
    bias = rng.standard_normal(w_shape[0]).astype(np.float32)
    return x, w, bias


def _error(y, reference):
    return float(np.abs(y - reference).max() / max(np.abs(reference).max(), 1e-30))


def _tiles_or_skip():
    if not (amx_gemm.has_amx_bf16() and jit.enabled()):
        pytest.skip("this CPU has no usable AMX-BF16 (or compiled kernels are off)")


@pytest.mark.parametrize("x_shape,w_shape,attrs", CASES)
def test_windows_are_packed_as_the_weight_reads_them(x_shape, w_shape, attrs):
    """The packed panels are pack_pairs of the im2col matrix [K, pixels] (k over channels, then taps)."""
    if not jit.enabled():
        pytest.skip("compiled kernels are off")
    x, w, _ = _operands(x_shape, w_shape)
    kernel = w_shape[2:]
    geo = geometry(x_shape[2:], kernel, attrs)
    xp = padded(x, geo.pads_begin, geo.pads_end)
    k = int(np.prod(w_shape[1:]))
    pairs = -(-k // (2 * bf16_gemm.TILE_PAIRS)) * bf16_gemm.TILE_PAIRS
    k_offsets, runs, panel_runs, step = amx_conv._layout(xp.shape[1:], kernel, geo.strides, geo.dilations, geo.out,
                                                          pairs, {})
    pixels = int(np.prod(geo.out))
    panels = np.full((-(-pixels // bf16_gemm.PANEL), pairs, bf16_gemm.PANEL), 0xDEADBEEF, np.uint32)
    amx_conv._pack_windows.get()(xp[0].reshape(-1).view(np.uint32), k_offsets, runs, panel_runs, step, panels)
    windows = np.stack([xp[0][(slice(None),) + tuple(
        slice(t * d, t * d + s * (o - 1) + 1, s) for t, d, s, o in zip(taps, geo.dilations, geo.strides, geo.out))]
        for taps in np.ndindex(*kernel)], axis=1)  # [C, taps, *out]
    np.testing.assert_array_equal(panels, bf16_gemm.pack_pairs(windows.reshape(k, pixels)))


@pytest.mark.parametrize("x_shape,w_shape,attrs", CASES)
def test_tiled_convolution_matches_float64(x_shape, w_shape, attrs):
    _tiles_or_skip()
    x, w, bias = _operands(x_shape, w_shape)
    attrs = {"kernel_shape": list(w_shape[2:]), **attrs}
    reference = conv_forward(x.astype(np.float64), w.astype(np.float64), bias.astype(np.float64), attrs)
    memo = {}
    y = conv_forward(x, w, bias, attrs, memo=memo, tiles=True)
    assert any(key[0] == "amx-conv-weight" for key in memo if isinstance(key, tuple)), "the tiles did not run"
    assert y.dtype == np.float32 and y.shape == reference.shape
    assert _error(y, reference) <= RTOL
    again = conv_forward(x, w, bias, attrs, memo=memo, tiles=True)  # the cached packing and layout
    np.testing.assert_array_equal(again, y)


def test_images_do_not_depend_on_the_batch():
    _tiles_or_skip()
    x, w, bias = _operands((3, 32, 20, 20), (48, 32, 3, 3))
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    whole = conv_forward(x, w, bias, attrs, memo={}, tiles=True)
    one = conv_forward(x[1:2], w, bias, attrs, memo={}, tiles=True)
    np.testing.assert_array_equal(whole[1:2], one)


def test_residual_and_activation_follow_the_tiles():
    """FusedConv's Z and activation (and so ConvEpilogue's) on a tiled convolution: Relu(conv + b + z)."""
    _tiles_or_skip()
    x, w, bias = _operands((1, 24, 15, 15), (40, 24, 3, 3))
    z = np.random.default_rng(1).standard_normal((1, 40, 15, 15)).astype(np.float32)
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "activation": "Relu"}
    reference = np.maximum(conv_forward(x.astype(np.float64), w.astype(np.float64), bias.astype(np.float64), attrs)
                           + z, 0.0)
    for with_z in (True, False):
        expected = reference if with_z else np.maximum(
            conv_forward(x.astype(np.float64), w.astype(np.float64), bias.astype(np.float64), attrs), 0.0)
        ctx = KernelContext(17, [None], bf16_tiles=True)
        y = fused_conv([x, w, bias, z if with_z else None], attrs, ctx)[0]
        assert any(isinstance(key, tuple) and key[0] == "amx-conv-weight" for key in ctx.memo)
        assert _error(y, expected) <= RTOL, with_z


def test_without_tiles_a_marked_step_runs_its_float32_kernel():
    x, w, bias = _operands((1, 16, 12, 12), (32, 16, 3, 3))
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    plain = conv_forward(x, w, bias, attrs, memo={})
    with bf16_gemm.disabled():
        memo = {}
        marked = conv_forward(x, w, bias, attrs, memo=memo, tiles=True)
    assert not any(isinstance(key, tuple) and key[0] == "amx-conv-weight" for key in memo)
    np.testing.assert_array_equal(marked, plain)


def test_depthwise_and_grouped_convolutions_keep_their_kernels():
    assert not amx_conv.applies((1, 8, 5, 5), (8, 1, 3, 3), 8)
    assert not amx_conv.applies((1, 8, 5, 5), (8, 4, 3, 3), 2)
    assert amx_conv.applies((1, 8, 5, 5), (4, 8, 3, 3), 1)


def test_a_rounding_only_tiled_convolutions_read_is_left_to_their_packing():
    """RoundTo(x) read by tiled convolutions alone: the executor drops it where the tiles run (the
    packing rounds the same way, so the outputs are the same bits) and keeps it where they do not."""
    from infc.compiler.runtime.executor import Executor

    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 16, 10, 10)).astype(np.float32)  # not bf16 values
    w = bf16_gemm.bf16_values(rng.standard_normal((24, 16, 3, 3)).astype(np.float32))
    steps = [{"op": "RoundTo", "domain": "infc.cpu", "inputs": ["x"], "outputs": ["xr"], "attrs": {"to": 16}},
             {"op": "Conv", "domain": "", "inputs": ["xr", "w"], "outputs": ["y"], "bf16_tiles": True,
              "attrs": {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}}]
    for tiles in (True, False):
        if tiles and not (amx_gemm.has_amx_bf16() and jit.enabled()):
            continue
        with bf16_gemm.disabled() if not tiles else contextlib.nullcontext():
            executor = Executor(steps, {"w": w}, 17, output_names=["y"])
            y = executor.run({"x": x})["y"]
            expected = conv_forward(bf16_gemm.bf16_values(x), w, None, steps[1]["attrs"], memo={}, tiles=tiles)
        ops = [step.label.split()[0] for step in executor._steps]
        assert ops == (["Conv"] if tiles else ["infc.cpu.RoundTo", "Conv"])
        np.testing.assert_array_equal(y, expected)


def test_random_geometries_match_float64():
    """Seeded random convolutions (rank, channels, kernel, strides, dilations, pads, batch) against float64."""
    _tiles_or_skip()
    rng = np.random.default_rng(7)
    for case in range(40):
        spatial = int(rng.integers(1, 4))
        kernel = [int(k) for k in rng.integers(1, 4, spatial)]
        dilations = [int(d) for d in rng.integers(1, 3, spatial)]
        strides = [int(s) for s in rng.integers(1, 4, spatial)]
        pads = [int(p) for p in rng.integers(0, 3, 2 * spatial)]
        size = [int(k * d + rng.integers(0, 9)) for k, d in zip(kernel, dilations)]
        c, m, n = int(rng.integers(1, 70)), int(rng.integers(1, 90)), int(rng.integers(1, 3))
        x, w, bias = _operands((n, c, *size), (m, c, *kernel), seed=case)
        attrs = {"kernel_shape": kernel, "dilations": dilations, "strides": strides, "pads": pads}
        reference = conv_forward(x.astype(np.float64), w.astype(np.float64), bias.astype(np.float64), attrs)
        y = conv_forward(x, w, bias, attrs, memo={}, tiles=True)
        assert y.shape == reference.shape and _error(y, reference) <= RTOL, (case, x.shape, w.shape, attrs)


@pytest.mark.parametrize("x_shape,w_shape,attrs", [CASES[1], CASES[5], ((1, 16, 20, 19), (80, 16, 3, 3), {"pads": [1, 1, 1, 1]})])
def test_windows_packed_a_chunk_at_a_time(monkeypatch, x_shape, w_shape, attrs):
    """Large images are packed and multiplied a few panels at a time (the packed windows of a 3x3
    convolution at 1024 x 1024 would take a gigabyte): two panels a chunk here, the last one alone."""
    _tiles_or_skip()
    monkeypatch.setattr(amx_conv, "CHUNK_BYTES", 1)
    x, w, bias = _operands(x_shape, w_shape)
    attrs = {"kernel_shape": list(w_shape[2:]), **attrs}
    reference = conv_forward(x.astype(np.float64), w.astype(np.float64), bias.astype(np.float64), attrs)
    y = conv_forward(x, w, bias, attrs, memo={}, tiles=True)
    assert _error(y, reference) <= RTOL
