"""Compiled transformer kernels (kernels/jit_norm.py, jit_activation.py, jit_rotary.py,
jit_attention.py, jit_chain.py): each op against its NumPy path (`jit.disabled()`) and against onnxruntime, on
random shapes with odd sizes, broadcast skips and biases, masks, NaN and Inf; rows computed alone
and in a batch must agree bitwise (decoder plans rely on batch invariance)."""

import numpy as np
import pytest
from infc.compiler.runtime import jit
from infc.compiler.runtime.kernels import (
    chain,
    jit_activation,
    jit_attention,
    jit_chain,
    jit_norm,
    jit_rotary,
    kernel_for,
)
from infc.compiler.runtime.kernels.common import KernelContext
from infc.compiler.verify import ort_session
from onnx import helper

F32, F64, I64 = np.float32, np.float64, np.int64
MS = "com.microsoft"
needs_jit = pytest.mark.skipif(not jit.enabled(), reason="numba is not installed (INFC_JIT=0 or missing)")


def run_kernel(domain, op, inputs, attrs, num_outputs=1, opset=23):
    return kernel_for(domain, op)(inputs, attrs, KernelContext(opset, [None] * num_outputs))


def both_paths(domain, op, inputs, attrs, num_outputs=1, opset=23):
    """(compiled outputs, NumPy outputs) of one kernel; the first is the NumPy path too without numba."""
    compiled = run_kernel(domain, op, inputs, attrs, num_outputs, opset)
    with jit.disabled():
        numpy_path = run_kernel(domain, op, inputs, attrs, num_outputs, opset)
    return compiled, numpy_path


def run_ort(domain, op, inputs, attrs, outputs, opset=23):
    """One node in onnxruntime; `inputs` is a list (None: omitted), `outputs` (name or "", dtype) pairs."""
    names = ["" if x is None else f"in{i}" for i, x in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    feeds = {n: x for n, x in zip(names, inputs) if n}

    def info(name, dtype, shape):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)

    node = helper.make_node(op, names, [o[0] for o in outputs], domain=domain or None, **attrs)
    graph = helper.make_graph([node], "t", [info(n, x.dtype, list(x.shape)) for n, x in feeds.items()],
                              [info(n, d, None) for n, d in outputs if n])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)],
                              ir_version=10)
    return ort_session(model).run([n for n, _ in outputs if n], feeds)


def assert_close(actual, expected, rtol=1e-5, atol=1e-6, what=""):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, (what, actual.shape, expected.shape)
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(actual), nan), f"{what}: NaN positions differ"
    inf = np.isinf(expected)
    assert np.array_equal(actual[inf], expected[inf]), f"{what}: Inf values differ"
    finite = ~(nan | inf)
    diff = np.abs(actual[finite].astype(F64) - expected[finite])
    limit = atol + rtol * np.abs(expected[finite].astype(F64))
    if diff.size:
        worst = int(np.argmax(diff - limit))
        assert (diff <= limit).all(), f"{what}: |diff| {diff[worst]:.3g} > {limit[worst]:.3g} at finite index {worst}"


def assert_all_close(actual, expected, **tolerance):
    assert len(actual) >= len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        if e is None:
            assert a is None, f"output {i}"
        else:
            assert_close(a, e, what=f"output {i}", **tolerance)


# --- normalizations -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("shape,axis", [((3, 7, 33), -1), ((2, 5, 4, 9), 2), ((1, 1), -1), ((6, 1), -1)])
def test_layer_norm_matches_numpy_and_ort(dtype, shape, axis):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    norm_shape = x.shape[axis:]
    scale, bias = rng.standard_normal(norm_shape).astype(dtype), rng.standard_normal(norm_shape).astype(dtype)
    attrs = {"axis": axis, "epsilon": 1e-5}
    compiled, numpy_path = both_paths("", "LayerNormalization", [x, scale, bias], attrs, 3)
    assert_all_close(compiled, numpy_path, rtol=1e-5 if dtype == F32 else 1e-12)
    expected = run_ort("", "LayerNormalization", [x, scale, bias], attrs, [("y", dtype), ("m", F32), ("s", F32)], 17)
    assert_close(compiled[0], expected[0], rtol=1e-4, atol=1e-5)
    if dtype == F32:  # ORT's statistics are float32 whatever the data
        assert_all_close(compiled[1:3], expected[1:3], rtol=1e-4, atol=1e-6)


def test_layer_norm_nan_row_and_absent_bias():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 19)).astype(F32)
    x[1, 3], x[2, 0] = np.nan, np.inf
    scale = rng.standard_normal(19).astype(F32)
    compiled, numpy_path = both_paths("", "LayerNormalization", [x, scale], {}, 3)
    assert_all_close(compiled, numpy_path)
    assert np.isnan(compiled[0][1]).all() and np.isnan(compiled[0][2]).all() and np.isfinite(compiled[0][0]).all()


def test_simplified_and_rms_norm_match_numpy_and_ort():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 5, 37)) + 0.5).astype(F32)
    scale = rng.random(37).astype(F32)
    compiled, numpy_path = both_paths("", "SimplifiedLayerNormalization", [x, scale], {"epsilon": 1e-6}, 2)
    assert_all_close(compiled, numpy_path)
    expected = run_ort("", "SimplifiedLayerNormalization", [x, scale], {"epsilon": 1e-6}, [("y", F32), ("s", F32)], 17)
    assert_all_close(compiled, expected, rtol=1e-4, atol=1e-6)
    compiled, numpy_path = both_paths("", "RMSNormalization", [x, scale], {"epsilon": 1e-6})
    assert_all_close(compiled, numpy_path)
    assert_close(compiled[0], run_ort("", "RMSNormalization", [x, scale], {"epsilon": 1e-6}, [("y", F32)])[0],
                 rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("skip_shape", [(3, 6, 37), (1, 6, 37), (6, 37), (37,)])
@pytest.mark.parametrize("with_beta,with_bias", [(True, True), (False, False), (True, False), (False, True)])
def test_skip_layer_norm(skip_shape, with_beta, with_bias):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 6, 37)).astype(F32)
    skip = rng.standard_normal(skip_shape).astype(F32)
    gamma = rng.random(37).astype(F32) + 0.5
    beta = rng.standard_normal(37).astype(F32) if with_beta else None
    bias = rng.standard_normal(37).astype(F32) if with_bias else None
    inputs = [x, skip, gamma, beta, bias]
    compiled, numpy_path = both_paths(MS, "SkipLayerNormalization", inputs, {"epsilon": 1e-5}, 4)
    assert_all_close(compiled, numpy_path)
    if skip_shape in ((3, 6, 37), (1, 6, 37), (6, 37)):  # the skip shapes onnxruntime accepts
        outputs = [("y", F32), ("m", F32), ("s", F32), ("sum", F32)]
        expected = run_ort(MS, "SkipLayerNormalization", inputs, {"epsilon": 1e-5}, outputs)
        assert_all_close(compiled, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("with_bias", [False, True])
def test_skip_simplified_layer_norm(with_bias):
    rng = np.random.default_rng(5)
    x, skip = rng.standard_normal((2, 9, 24)).astype(F32), rng.standard_normal((2, 9, 24)).astype(F32)
    gamma = rng.random(24).astype(F32)
    inputs = [x, skip, gamma, rng.standard_normal(24).astype(F32) if with_bias else None]
    compiled, numpy_path = both_paths(MS, "SkipSimplifiedLayerNormalization", inputs, {"epsilon": 1e-6}, 4)
    assert compiled[1] is None
    assert_all_close(compiled, numpy_path)
    expected = run_ort(MS, "SkipSimplifiedLayerNormalization", inputs, {"epsilon": 1e-6},
                       [("y", F32), ("", F32), ("s", F32), ("sum", F32)])
    assert_all_close([compiled[0], compiled[2], compiled[3]], expected, rtol=1e-4, atol=1e-5)


def test_skip_norm_without_the_sum_output():
    """A node with fewer than four outputs: the sum is not kept (and not returned)."""
    rng = np.random.default_rng(6)
    x, skip = rng.standard_normal((2, 3, 16)).astype(F32), rng.standard_normal((2, 3, 16)).astype(F32)
    gamma = rng.random(16).astype(F32)
    one_output = run_kernel(MS, "SkipLayerNormalization", [x, skip, gamma], {}, 1)
    four_outputs = run_kernel(MS, "SkipLayerNormalization", [x, skip, gamma], {}, 4)
    assert np.array_equal(one_output[0], four_outputs[0])


@needs_jit
def test_norm_entry_point_takes_supported_cases_and_declines_others():
    x = np.ones((4, 8), F32)
    assert jit_norm.normalize_rows(x, 1, np.ones(8, F32), None, 1e-5, True) is not None
    assert jit_norm.normalize_rows(x.astype(np.float16), 1, None, None, 1e-5, True) is None
    strided = np.random.default_rng(0).standard_normal((4, 16)).astype(F32)[:, ::2]
    # strided rows take the compiled path too (copied): the path must not depend on the layout
    assert np.array_equal(jit_norm.normalize_rows(strided, 1, None, None, 1e-5, True)[0],
                          jit_norm.normalize_rows(np.ascontiguousarray(strided), 1, None, None, 1e-5, True)[0])
    assert jit_norm.normalize_rows(x, 1, np.ones(8, F64), None, 1e-5, True) is None  # mixed dtypes
    assert jit_norm.normalize_rows(x, 1, None, None, 1e-5, True, skip=np.ones((3, 8), F32)) is None  # 4 % 3


@needs_jit
@pytest.mark.parametrize("rows", [8, 4097])  # 4097 rows of 64: large enough to split across two threads
def test_norms_are_batch_invariant(rows):
    rng = np.random.default_rng(7)
    x, skip = rng.standard_normal((rows, 64)).astype(F32), rng.standard_normal((rows, 64)).astype(F32)
    gamma, beta = rng.random(64).astype(F32), rng.standard_normal(64).astype(F32)
    full = run_kernel(MS, "SkipLayerNormalization", [x, skip, gamma, beta], {}, 4)
    layer = run_kernel("", "LayerNormalization", [x, gamma, beta], {}, 3)
    for start, stop in ((0, 1), (3, 5), (rows - 1, rows)):
        part = run_kernel(MS, "SkipLayerNormalization", [x[start:stop], skip[start:stop], gamma, beta], {}, 4)
        for a, b in zip(part, full):
            assert np.array_equal(a, b[start:stop])
        part = run_kernel("", "LayerNormalization", [np.ascontiguousarray(x[start:stop]), gamma, beta], {}, 3)
        for a, b in zip(part, layer):
            assert np.array_equal(a, b[start:stop])
    with jit.disabled():
        numpy_path = run_kernel(MS, "SkipLayerNormalization", [x, skip, gamma, beta], {}, 4)
    assert_all_close(full, numpy_path)


# --- GELU family ------------------------------------------------------------------------------------

def _gelu_input(rng, shape=(3, 7, 37), scale=4.0, specials=True):
    x = (rng.standard_normal(shape) * scale).astype(F32)
    if specials:
        x.reshape(-1)[:5] = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    return x


GELUS = [("", "Gelu", {}, 20), ("", "Gelu", {"approximate": "tanh"}, 20), (MS, "Gelu", {}, 1),
         (MS, "FastGelu", {}, 1), (MS, "QuickGelu", {}, 1), (MS, "QuickGelu", {"alpha": 1.0}, 1)]


@pytest.mark.parametrize("domain,op,attrs,opset", GELUS)
def test_gelus_match_numpy_with_nan_and_inf(domain, op, attrs, opset):
    x = _gelu_input(np.random.default_rng(8))
    with np.errstate(invalid="ignore"):
        compiled, numpy_path = both_paths(domain, op, [x], attrs, 1, opset)
    # float32 fits of erf and tanh: a few e-7 absolute, relative to max(1, |x|)
    assert_close(compiled[0], numpy_path[0], rtol=1e-5, atol=3e-6)


@pytest.mark.parametrize("domain,op,attrs,opset", GELUS)
def test_gelus_match_ort(domain, op, attrs, opset):
    x = _gelu_input(np.random.default_rng(9), shape=(2, 5, 33), specials=False)
    expected = run_ort(domain, op, [x], attrs, [("y", F32)], opset)
    assert_close(run_kernel(domain, op, [x], attrs, 1, opset)[0], expected[0], rtol=1e-5, atol=3e-6)


@pytest.mark.parametrize("bias_shape", [(37,), (1, 1, 37)])
def test_bias_gelu_and_fast_gelu_with_bias(bias_shape):
    rng = np.random.default_rng(10)
    x = _gelu_input(rng, specials=False)
    bias = rng.standard_normal(bias_shape).astype(F32)
    for op in ("BiasGelu", "FastGelu"):
        compiled, numpy_path = both_paths(MS, op, [x, bias], {})
        assert_close(compiled[0], numpy_path[0], rtol=1e-5, atol=3e-6)
        if bias.ndim == 1:
            assert_close(compiled[0], run_ort(MS, op, [x, bias], {}, [("y", F32)])[0], rtol=1e-5, atol=3e-6)


@needs_jit
def test_gelu_entry_point_strided_input_and_declines():
    rng = np.random.default_rng(11)
    wide = rng.standard_normal((4, 6, 80)).astype(F32)
    strided = wide[:, :, :40]  # a slice of a fused projection, as QuickGelu sees in llama
    y = jit_activation.gelu(strided, None, jit_activation.QUICK_FORM, 1.0)
    with jit.disabled():
        expected = run_kernel(MS, "QuickGelu", [np.ascontiguousarray(strided)], {"alpha": 1.0})[0]
    assert_close(y, expected, rtol=1e-5, atol=3e-6)
    assert jit_activation.gelu(wide.astype(F64), None, jit_activation.ERF_FORM) is None  # float64: NumPy path
    assert jit_activation.gelu(wide, np.ones(7, F32), jit_activation.ERF_FORM) is None  # bias does not fit


@needs_jit
def test_gelu_is_batch_invariant_and_splits_large_inputs():
    rng = np.random.default_rng(12)
    x = _gelu_input(rng, shape=(4099, 64), specials=False)
    bias = rng.standard_normal(64).astype(F32)
    full = run_kernel(MS, "BiasGelu", [x, bias], {})[0]
    assert np.array_equal(run_kernel(MS, "BiasGelu", [x[5:7], bias], {})[0], full[5:7])
    with jit.disabled():
        assert_close(full, run_kernel(MS, "BiasGelu", [x, bias], {})[0], rtol=1e-5, atol=3e-6)


# --- rotary embedding ---------------------------------------------------------------------------

def _caches(rng, positions, half):
    angles = np.arange(positions)[:, None] * rng.random(half)[None, :]
    return np.cos(angles).astype(F32), np.sin(angles).astype(F32)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("layout", ["3d", "3d strided", "4d"])
@pytest.mark.parametrize("positions", ["ids", "offset"])
def test_contrib_rotary(interleaved, layout, positions):
    rng = np.random.default_rng(13)
    b, s, n, h = 2, 5, 3, 10
    if layout == "4d":
        x = rng.standard_normal((b, n, s, h)).astype(F32)
    else:
        x = rng.standard_normal((b, s, 2 * n * h)).astype(F32)[:, :, :n * h]
        x = x if layout == "3d strided" else np.ascontiguousarray(x)
    pos = rng.integers(0, 20, (b, s)).astype(I64) if positions == "ids" else np.array([4], I64)
    cos, sin = _caches(rng, 20, h // 2)
    attrs = {"interleaved": interleaved, **({"num_heads": n} if layout != "4d" else {})}
    compiled, numpy_path = both_paths(MS, "RotaryEmbedding", [x, pos, cos, sin], attrs)
    assert compiled[0].flags.c_contiguous
    assert_close(compiled[0], numpy_path[0])
    expected = run_ort(MS, "RotaryEmbedding", [np.ascontiguousarray(x), pos, cos, sin], attrs, [("y", F32)])
    assert_close(compiled[0], expected[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("with_positions", [True, False])
def test_onnx_rotary_partial_dims(interleaved, with_positions):
    rng = np.random.default_rng(14)
    b, n, s, h = 2, 3, 5, 12
    x = rng.standard_normal((b, n, s, h)).astype(F32)
    if with_positions:
        cos, sin = _caches(rng, 16, 3)
        inputs = [x, cos, sin, rng.integers(0, 16, (b, s)).astype(I64)]
    else:  # caches per token: [B, S, rot / 2]
        cos, sin = rng.standard_normal((2, b, s, 3)).astype(F32)
        inputs = [x, cos, sin]
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": 6}
    compiled, numpy_path = both_paths("", "RotaryEmbedding", inputs, attrs)
    assert_close(compiled[0], numpy_path[0])
    assert_close(compiled[0], run_ort("", "RotaryEmbedding", inputs, attrs, [("y", F32)])[0], rtol=1e-5, atol=1e-6)


def test_rotary_nan_and_out_of_range_positions():
    rng = np.random.default_rng(15)
    x = rng.standard_normal((1, 4, 16)).astype(F32)
    x[0, 1, 3] = np.nan
    cos, sin = _caches(rng, 8, 4)
    compiled, numpy_path = both_paths(MS, "RotaryEmbedding", [x, np.arange(4)[None], cos, sin], {"num_heads": 2})
    assert_close(compiled[0], numpy_path[0])
    assert np.isnan(compiled[0][0, 1, 3]) and np.isnan(compiled[0]).sum() == 2  # x_1 and its pair
    with pytest.raises(IndexError):  # the NumPy path's error, compiled kernels on or off
        run_kernel(MS, "RotaryEmbedding", [x, np.array([[0, 1, 2, 8]]), cos, sin], {"num_heads": 2})


@needs_jit
def test_rotary_is_batch_invariant():
    rng = np.random.default_rng(16)
    x = rng.standard_normal((6, 3, 32)).astype(F32)
    pos = rng.integers(0, 30, (6, 3)).astype(I64)
    cos, sin = _caches(rng, 30, 8)
    full = run_kernel(MS, "RotaryEmbedding", [x, pos, cos, sin], {"num_heads": 2})[0]
    alone = run_kernel(MS, "RotaryEmbedding", [x[4:5], pos[4:5], cos, sin], {"num_heads": 2})[0]
    assert np.array_equal(alone, full[4:5])
    assert jit_rotary.rotate(x, 2, cos.astype(F64), sin, pos, False, 16) is None  # mixed dtypes


# --- multi-head attention -----------------------------------------------------------------------

def _mha_inputs(rng, b=2, s=5, t=9, n=3, h=7):
    q = rng.standard_normal((b, s, n * h)).astype(F32)
    k, v = rng.standard_normal((2, b, t, n * h)).astype(F32)
    return q, k, v


@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("bias_shape", [None, (1, 3, 5, 9), (2, 1, 5, 9)])
def test_mha_matches_numpy_and_ort(unidirectional, bias_shape):
    rng = np.random.default_rng(17)
    q, k, v = _mha_inputs(rng)
    bias = None if bias_shape is None else rng.standard_normal(bias_shape).astype(F32)
    attrs = {"num_heads": 3, "unidirectional": unidirectional}
    inputs = [q, k, v, None, None, bias]
    compiled, numpy_path = both_paths(MS, "MultiHeadAttention", inputs, attrs, 3)
    assert_all_close(compiled, numpy_path)
    if not unidirectional:  # onnxruntime's CPU MultiHeadAttention has no unidirectional mode
        assert_close(compiled[0], run_ort(MS, "MultiHeadAttention", inputs, attrs, [("y", F32)])[0], rtol=1e-4,
                     atol=1e-5)


@pytest.mark.parametrize("mask", ["lengths", "2d", "3d"])
def test_mha_key_padding_masks(mask):
    rng = np.random.default_rng(18)
    q, k, v = _mha_inputs(rng)
    if mask == "lengths":
        padding = np.array([4, 9], np.int32)
    else:
        padding = (rng.random((2, 9) if mask == "2d" else (2, 5, 9)) < 0.7).astype(np.int32)
        padding[..., 0] = 1
    inputs = [q, k, v, None, padding, rng.standard_normal((1, 3, 5, 9)).astype(F32)]
    attrs = {"num_heads": 3, "scale": 0.3}
    compiled, numpy_path = both_paths(MS, "MultiHeadAttention", inputs, attrs, 3)
    assert_all_close(compiled, numpy_path)
    if mask == "2d":
        assert_close(compiled[0], run_ort(MS, "MultiHeadAttention", inputs, attrs, [("y", F32)])[0], rtol=1e-4,
                     atol=1e-5)


def test_mha_past_present_nan_and_fully_masked_rows():
    rng = np.random.default_rng(19)
    q, k, v = _mha_inputs(rng, s=3, t=3, n=2, h=8)
    past_k, past_v = rng.standard_normal((2, 2, 2, 6, 8)).astype(F32)
    bias = np.zeros((2, 2, 3, 9), F32)
    bias[0, 1, 2] = -np.inf  # a row with every key masked: zeros
    bias[1, 0, :, 4] = 60.0  # large scores: the softmax's classic way
    q[1, 0, 9] = np.nan  # batch 1, query 0, head 1: a NaN row
    inputs = [q, k, v, None, None, bias, past_k, past_v]
    compiled, numpy_path = both_paths(MS, "MultiHeadAttention", inputs, {"num_heads": 2}, 3)
    assert_all_close(compiled, numpy_path)
    y = compiled[0].reshape(2, 3, 2, 8)
    assert (y[0, 2, 1] == 0).all() and np.isnan(y[1, 0, 1]).all() and np.isfinite(y[1, 0, 0]).all()
    finite = [q, k, v, None, None, np.zeros((2, 2, 3, 9), F32), past_k, past_v]
    expected = run_ort(MS, "MultiHeadAttention", finite, {"num_heads": 2}, [("y", F32), ("pk", F32), ("pv", F32)])
    assert_all_close(run_kernel(MS, "MultiHeadAttention", finite, {"num_heads": 2}, 3), expected, rtol=1e-4,
                     atol=1e-5)


@needs_jit
@pytest.mark.parametrize("batch,heads,bias_shape", [(1, 8, (1, 8, 128, 128)), (1, 8, (1, 1, 128, 128)),
                                                    (3, 4, (3, 1, 128, 128)), (3, 4, (1, 4, 1, 128))])
def test_mha_split_between_cores_is_bitwise_the_whole(batch, heads, bias_shape, monkeypatch):
    # large enough to be split by heads (one image) or by batch items; every part runs the same
    # GEMMs and compiled call over its slice, so the result is the one-part result bit for bit
    rng = np.random.default_rng(21)
    q = rng.standard_normal((batch, heads, 128, 16)).astype(F32)
    k, v = rng.standard_normal((2, batch, heads, 128, 16)).astype(F32)
    bias = rng.standard_normal(bias_shape).astype(F32)
    padding = (rng.random((batch, 128)) < 0.8).astype(np.int32)
    padding[:, 0] = 1
    split = jit_attention.attend(q, k, v, padding, bias, 0.25, -1e4, False)
    monkeypatch.setattr(jit_attention, "HELPERS", 0)
    whole = jit_attention.attend(q, k, v, padding, bias, 0.25, -1e4, False)
    np.testing.assert_array_equal(split, whole)
    mha = run_kernel(MS, "MultiHeadAttention", [q.transpose(0, 2, 1, 3).reshape(batch, 128, heads * 16),
                                               k, v, None, padding, bias], {"num_heads": heads, "scale": 0.25}, 3)
    assert_close(split, mha[0], rtol=1e-5, atol=1e-6)


@needs_jit
def test_mha_entry_point_declines_float64_and_odd_masks():
    q = np.ones((1, 2, 3, 4), F32)
    assert jit_attention.attend(q.astype(F64), q.astype(F64), q.astype(F64), None, None, 0.5, -1e4, False) is None
    assert jit_attention.attend(q, q, q, np.ones((1, 3, 3, 3), np.int32), None, 0.5, -1e4, False) is None
    assert jit_attention.attend(q, q, q, None, np.ones((1, 2, 3, 1), F32), 0.5, -1e4, False) is None  # T broadcast
    assert jit_attention.attend(q, q, q, None, None, 0.5, -1e4, False) is not None


def test_a_token_alone_and_among_others_takes_the_same_path():
    """A decoder step's slice of a fused projection is strided for several tokens and contiguous
    for one: each op must give the token's row bitwise the same either way."""
    rng = np.random.default_rng(20)
    fused = rng.standard_normal((1, 7, 96)).astype(F32)
    many, alone = fused[:, :, :32], fused[:, 3:4, :32]
    assert not many.flags.c_contiguous and alone.flags.c_contiguous
    gamma = rng.random(32).astype(F32)
    cos, sin = _caches(rng, 10, 8)
    positions = np.arange(7, dtype=I64)[None]
    cases = [("", "SimplifiedLayerNormalization", lambda x: [x, gamma], {}),
             (MS, "QuickGelu", lambda x: [x], {"alpha": 1.702}),
             (MS, "SkipLayerNormalization", lambda x: [x, x, gamma], {}),
             (MS, "RotaryEmbedding", lambda x: [x, positions[:, 3:4] if x.shape[1] == 1 else positions, cos, sin],
              {"num_heads": 2})]
    for domain, op, inputs, attrs in cases:
        row = run_kernel(domain, op, inputs(alone), attrs)[0]
        assert np.array_equal(row, run_kernel(domain, op, inputs(many), attrs)[0][:, 3:4]), op


# --- elementwise chains -------------------------------------------------------------------------

def _chain(inputs, ops, out=None):
    return chain.elementwise_chain(inputs, {"ops": ops}, KernelContext(17, [out]))[0]


def _both_chain_paths(inputs, ops):
    compiled = _chain(inputs, ops)
    with jit.disabled():
        return compiled, _chain(inputs, ops)


ARITHMETIC = [{"op": "Add", "args": [0, 1]}, {"op": "Mul", "args": [-1, 2]}, {"op": "Sub", "args": [-2, -1]},
              {"op": "Div", "args": [-3, 1]}, {"op": "Relu", "args": [-4]}, {"op": "Neg", "args": [-5]},
              {"op": "Abs", "args": [-6]}, {"op": "Sqrt", "args": [-7]},
              {"op": "LeakyRelu", "args": [-4], "attrs": {"alpha": 0.1}}, {"op": "Add", "args": [-9, -8]}]


@pytest.mark.parametrize("shapes", [[(3, 5, 37), (37,), (1, 5, 37)], [(2, 1, 1, 16), (), (1,)],
                                    [(5, 37), (3, 5, 37), (1, 1, 37)], [(64, 80, 70), (70,), (80, 70)]])
def test_chain_is_bitwise_the_numpy_path(shapes):
    rng = np.random.default_rng(21)
    inputs = [np.asarray(rng.standard_normal(s) * 3, dtype=F32) for s in shapes]
    inputs[0].reshape(-1)[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30]
    inputs[1].flags.writeable = False  # a weight
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        compiled, numpy_path = _both_chain_paths(inputs, ARITHMETIC)
    assert compiled.shape == numpy_path.shape
    # exactly rounded ops: the same bits, NaN and signed zeros included
    assert np.array_equal(compiled.view(np.int32), numpy_path.view(np.int32))


@needs_jit
def test_chain_takes_exact_ops_only_and_writes_the_donated_buffer():
    assert jit_chain.CompiledChain.prepare(ARITHMETIC, [(4, 8), (8,), (1, 8)], (4, 8), np.dtype(F32)) is not None
    for op in ({"op": "HardSigmoid", "args": [0]}, {"op": "Exp", "args": [0]}, {"op": "Clip", "args": [0, 1, None]}):
        assert jit_chain.CompiledChain.prepare([op], [(4, 8), (8,)], (4, 8), np.dtype(F32)) is None
    assert jit_chain.CompiledChain.prepare(ARITHMETIC[:1], [(4, 8), (4, 1)], (4, 8), np.dtype(F32)) is None  # a column
    assert jit_chain.CompiledChain.prepare(ARITHMETIC[:1], [(4, 8), (8,)], (4, 8), np.dtype(np.int64)) is None
    rng = np.random.default_rng(22)
    x, y = rng.standard_normal((2, 3, 8)).astype(F32), rng.standard_normal((3, 8)).astype(F32)
    expected = (x + y) * y
    donated = x.copy()
    got = _chain([donated, y], [{"op": "Add", "args": [0, 1]}, {"op": "Mul", "args": [-1, 1]}], out=donated)
    assert got is donated and np.array_equal(got, expected)
    strided = rng.standard_normal((2, 3, 16)).astype(F32)[:, :, ::2]
    assert np.array_equal(_chain([strided, y], ARITHMETIC[:1]), strided + y)
