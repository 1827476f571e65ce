"""Device ops (runtime/cuda/ops_*.py) on the NumPy stand-in: each against the CPU kernel on seeded random
data across attribute variants, and every fixture model run by the device executor with no host
fallback, against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from infc.compiler.build import _table_rows
from infc.compiler.quantize.expert_weights import per_expert_channel
from infc.compiler.runtime.cuda.backend import numpy_backend
from infc.compiler.runtime.cuda.executor import DeviceContext, DeviceExecutor
from infc.compiler.runtime.cuda.ops import device_op_for
from infc.compiler.runtime.feeds_io import random_inputs
from infc.compiler.runtime.kernels import kernel_for
from infc.compiler.runtime.kernels.common import KernelContext
from infc.compiler.verify import ort_session

from .test_executor import lowered

F32 = np.float32
RNG = np.random.default_rng(12)


def _normal(*shape):
    return RNG.standard_normal(shape).astype(F32)


def check(domain: str, op: str, inputs: list, attrs: dict, num_outputs: int = 1, opset: int = 17):
    """The device op (inputs as device arrays) against the CPU kernel: same shapes, 1e-5 relative."""
    device = device_op_for(domain, op, attrs)
    assert device is not None, f"no device op for {domain}.{op} {attrs}"
    backend = numpy_backend()
    host_positions = set(getattr(device, "host_inputs", ()))
    args = [None if x is None else x if i in host_positions else backend.to_device(x) for i, x in enumerate(inputs)]
    got = device(args, attrs, DeviceContext(backend.xp, backend.erf, opset, [None] * num_outputs))
    want = kernel_for(domain, op)(inputs, attrs, KernelContext(opset, [None] * num_outputs))
    for g, w in zip(got[:num_outputs], want[:num_outputs]):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        if w.dtype.kind in "iu":  # float results truncated: a different rounding order may flip one unit
            assert np.abs(g.astype(np.int64) - w).max() <= 1, f"{op} {attrs}"
            continue
        scale = max(float(np.abs(w).max()), 1e-30)
        assert np.abs(g.astype(np.float64) - w).max() / scale <= 1e-5, f"{op} {attrs}"


@pytest.mark.parametrize("variant", ["plain", "bias_mask_lengths", "mask_2d_bias_causal", "left_padded_causal", "packed_qkv",
                                     "past"])
def test_multi_head_attention(variant):
    b, s, n, h = 2, 5, 2, 4
    q, k, v = _normal(b, s, n * h), _normal(b, s, n * h), _normal(b, s, n * h)
    inputs, attrs = [q, k, v], {"num_heads": n}
    if variant == "bias_mask_lengths":
        inputs = [q, k, v, _normal(3 * n * h), np.array([5, 3], dtype=np.int32)]
    elif variant == "mask_2d_bias_causal":
        mask = np.ones((b, s), dtype=np.int32)
        mask[1, 3:] = 0
        inputs, attrs = [q, k, v, None, mask, _normal(1, n, s, s)], {"num_heads": n, "unidirectional": 1, "scale": 0.3}
    elif variant == "left_padded_causal":  # the first queries see only padded keys: filler added, future keys dropped
        mask = np.ones((b, s), dtype=np.int32)
        mask[1, :3] = 0
        inputs, attrs = [q, k, v, None, mask], {"num_heads": n, "unidirectional": 1}
    elif variant == "packed_qkv":
        inputs = [_normal(b, s, n, 3, h)]
    elif variant == "past":
        inputs = [q, k, v, None, None, None, _normal(b, n, 3, h), _normal(b, n, 3, h)]
    check("com.microsoft", "MultiHeadAttention", inputs, attrs, num_outputs=3 if variant == "past" else 1)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("form", ["contrib_3d", "contrib_scalar_position", "onnx_4d_partial"])
def test_rotary_embedding(form, interleaved):
    b, s, n, h, positions = 2, 4, 3, 8, 12
    cos, sin = _normal(positions, h // 2), _normal(positions, h // 2)
    ids = RNG.integers(0, positions, (b, s)).astype(np.int64)
    if form == "contrib_3d":
        check("com.microsoft", "RotaryEmbedding", [_normal(b, s, n * h), ids, cos, sin], {"interleaved": interleaved})
    elif form == "contrib_scalar_position":
        check("com.microsoft", "RotaryEmbedding", [_normal(b, n, s, h), np.array([3], np.int64), cos, sin],
              {"interleaved": interleaved, "num_heads": n})
    else:
        check("", "RotaryEmbedding", [_normal(b, n, s, h), cos[:, :2], sin[:, :2], ids],
              {"interleaved": interleaved, "rotary_embedding_dim": 4})


@pytest.mark.parametrize("attrs, scales, sizes", [
    ({"mode": "nearest"}, [1, 1, 2, 2], None),
    ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, [1, 1, 1.5, 0.5], None),
    ({"mode": "linear"}, [1, 1, 2, 3], None),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, None, [2, 3, 9, 4]),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, [1, 1, 0.5, 0.7], None),
    ({"mode": "cubic", "antialias": 1}, [1, 1, 0.6, 1.4], None),
    ({"mode": "linear", "axes": [2, 3]}, [1.7, 2.0], None),
])
def test_resize(attrs, scales, sizes):
    x = _normal(2, 3, 6, 5)
    inputs = [x, None, None if scales is None else np.array(scales, F32), None if sizes is None else np.array(sizes, np.int64)]
    check("", "Resize", inputs, attrs)
    check("", "Resize", [RNG.integers(0, 200, (1, 2, 4, 4)).astype(np.uint8)] + inputs[1:], attrs)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 1, 0, 0]},
])
def test_average_pool(attrs):
    check("", "AveragePool", [_normal(2, 3, 7, 8)], attrs)


@pytest.mark.parametrize("attrs", [{"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
                                   {"kernel_shape": [2, 3], "pads": [0, 2, 1, 0]}])
def test_max_pool_pads_with_minus_infinity(attrs):
    check("", "MaxPool", [_normal(2, 3, 7, 8) - 10], attrs)  # all negative: a zero border would win


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((2, 3, 9, 8), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 4, 11, 10), (6, 4, 3, 2), {"strides": [2, 3], "pads": [1, 0, 2, 1], "dilations": [2, 1]}),
    ((2, 3, 7, 7), (4, 3, 1, 1), {"strides": [2, 2]}),
    ((1, 2, 13), (3, 2, 4), {"strides": [2], "pads": [3, 1], "dilations": [2]}),
    ((1, 2, 5, 6, 4), (3, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1]}),
    ((2, 4, 8, 8), (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    ((2, 4, 8, 8), (4, 1, 3, 3), {"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
])
def test_convolution(x_shape, w_shape, attrs):
    """im2col by one strided view (group 1: strides, dilations, asymmetric pads, 1-3 spatial dims), grouped
    and depthwise taps, with a bias."""
    check("", "Conv", [_normal(*x_shape), _normal(*w_shape), _normal(w_shape[0])], attrs)
    check("", "Conv", [_normal(*x_shape), _normal(*w_shape)], attrs)


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"])
def test_reductions(op):
    x = _normal(2, 3, 4)
    check("", op, [x, np.array([1, -1], np.int64)], {"keepdims": 0}, opset=18)
    check("", op, [x], {"axes": [0], "keepdims": 1}, opset=13)


@pytest.mark.parametrize("model_name", ["bert_ts.onnx", "gpt2_ts.onnx", "llama_ts.onnx", "llama_dynamo.onnx",
                                        "cnn_dynamo.onnx"])
def test_fixture_models_run_with_no_host_fallback(model_name):
    model, program, profile, _ = lowered(model_name)
    executor = DeviceExecutor(program.steps, program.weights, program.opset, numpy_backend(), islands=program.islands,
                              output_names=[o["name"] for o in program.outputs])
    report = executor.report()
    assert report["host_fallback_ops"] == [] and "host fallback" not in report["placement"]
    feeds = random_inputs(program.inputs, profile.shapes("opt"), _table_rows(program), seed=8)
    expected = ort_session(model).run(executor.output_names, feeds)
    actual = executor.run(feeds)
    for name, want in zip(executor.output_names, expected):
        error = np.abs(actual[name].astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30)
        assert error <= 1e-4, f"{model_name} {name}: {error:.2e}"


def test_the_bias_gelu_kernel_body_compiles_for_sm90(compile_elementwise_body):
    from infc.compiler.runtime.cuda.ops_elementwise import BIAS_GELU_CUDA

    compile_elementwise_body(BIAS_GELU_CUDA, ("x", "bias"), "y")


@pytest.mark.parametrize("side", [0, 1])
def test_expert_matmul(side):
    """A mixture of experts' grouped GEMMs (kernels/expert_gemm.py): routing indices on the host, one
    device GEMM per expert; negative indices and an expert nobody chose included."""
    idx = np.array([2, -1, 0, 2, 2, 1, -4, 0], dtype=np.int64)
    x = _normal(8, 24, 1) if side == 0 else _normal(8, 2, 24)
    check("infc.cpu", "ExpertMatMul", [x, idx, _normal(5, 24, 16)], {"weights_side": side})
    # int8 experts (w8 plans: codes and a scale per expert and column), each rebuilt on the device
    codes, scale = per_expert_channel(_normal(5, 24, 16))
    check("infc.cpu", "ExpertMatMul", [x, idx, codes, scale], {"weights_side": side})
