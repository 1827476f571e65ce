"""Compiled convolution kernels (compiler/runtime/kernels/jit_conv.py): depthwise, small dense,
pointwise bias + activation, and the activations they fuse, against onnxruntime and against the
NumPy paths (`jit.disabled()`) on random shapes: odd sizes, strides, dilations, asymmetric pads,
channel multipliers, batches, float64, NaN and Inf."""

import numpy as np
import onnx
import pytest
from infc.compiler.graph import import_graph
from infc.compiler.lower import lower_graph
from infc.compiler.runtime import jit
from infc.compiler.runtime.executor import Executor
from infc.compiler.runtime.kernels import conv, has_kernel, jit_conv
from infc.compiler.runtime.kernels.conv_epilogue import _known_activation
from infc.compiler.verify import compare_outputs, ort_session
from onnx import helper, numpy_helper

MS = "com.microsoft"
F32, F64 = np.float32, np.float64
RTOL = {np.dtype(F32): 2e-5, np.dtype(F64): 1e-11}

needs_numba = pytest.mark.skipif(not jit.enabled(), reason="numba missing or INFC_JIT=0: no compiled kernels")


def _model(nodes, feeds: dict, inits: dict, output_dtype) -> onnx.ModelProto:
    def info(name, array):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), list(array.shape))

    graph = helper.make_graph(nodes, "test", [info(n, a) for n, a in feeds.items()],
                              [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(output_dtype)), None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model)  # value types let lowering chain an elementwise run


def _run(model, feeds) -> np.ndarray:
    program = lower_graph(import_graph(model), has_kernel, allow_fallback=False)
    executor = Executor(program.steps, program.weights, program.opset, program.islands, ["y"])
    return executor.run(feeds)["y"]


def _check(model, feeds, reference_model=None):
    """Compiled and NumPy paths both match onnxruntime and each other. ORT has no float64 Conv:
    float64 cases check against ORT on `reference_model` (the float32 model) with float32's
    tolerance, and the two paths against each other at float64's."""
    reference_model = reference_model or model
    expected = ort_session(reference_model).run(["y"], {k: v.astype(F32) for k, v in feeds.items()})[0]
    compiled = _run(model, feeds)
    with jit.disabled():
        reference = _run(model, feeds)
    for name, actual in (("compiled", compiled), ("numpy", reference)):
        assert actual.dtype == next(iter(feeds.values())).dtype, f"{name}: dtype {actual.dtype}"
        diff = compare_outputs(["y"], [expected], [actual])[0]
        assert diff.max_rel_diff <= RTOL[np.dtype(F32)], (
            f"{name} path: max rel diff {diff.max_rel_diff:.3g} (max abs {diff.max_abs_diff:.3g} at {diff.worst_index})")
    diff = compare_outputs(["y"], [reference], [compiled])[0]
    assert diff.max_rel_diff <= RTOL[compiled.dtype], f"compiled vs numpy: {diff}"
    np.testing.assert_array_equal(np.isnan(compiled), np.isnan(reference))


def _conv_case(rng, x_shape, w_shape, attrs, dtype=F32, with_bias=True, op="Conv", tail=()):
    """(model, feeds, float32 model) with the same random data."""
    x = rng.standard_normal(x_shape)
    inits = {"w": rng.standard_normal(w_shape)}
    inputs = ["x", "w"]
    if with_bias:
        inits["b"] = rng.standard_normal(w_shape[0])
        inputs.append("b")
    out = "c" if tail else "y"
    node = helper.make_node(op, inputs, [out], domain=MS if op == "FusedConv" else None, **attrs)

    def model(as_type):
        return _model([node, *tail], {"x": x.astype(as_type)}, {k: v.astype(as_type) for k, v in inits.items()}, as_type)

    return model(dtype), {"x": x.astype(dtype)}, model(F32)


DEPTHWISE = [  # x, w, attrs
    ((1, 6, 12, 10), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),
    ((3, 5, 9, 11), (5, 1, 5, 5), {"group": 5, "pads": [2, 2, 2, 2]}),
    ((2, 7, 13, 12), (7, 1, 3, 3), {"group": 7, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 4, 11, 17), (4, 1, 5, 5), {"group": 4, "strides": [2, 1], "pads": [2, 1, 0, 2]}),
    ((1, 4, 12, 9), (4, 1, 3, 3), {"group": 4, "strides": [1, 2], "pads": [0, 1, 2, 1]}),
    ((1, 3, 14, 15), (3, 1, 3, 3), {"group": 3, "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((2, 3, 10, 13), (3, 1, 3, 2), {"group": 3, "dilations": [2, 3], "strides": [2, 3], "pads": [1, 0, 3, 2]}),
    ((2, 4, 9, 9), (8, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),  # channel multiplier 2
    ((2, 3, 7, 8), (9, 1, 5, 5), {"group": 3, "pads": [2, 2, 2, 2], "strides": [2, 1]}),  # multiplier 3
    ((1, 5, 7, 9), (5, 1, 3, 3), {"group": 5, "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((3, 7, 2, 15), (7, 1, 5, 5), {"group": 7, "pads": [2, 2, 2, 2]}),  # fewer rows than the kernel
    ((1, 6, 21, 8), (6, 1, 7, 7), {"group": 6, "pads": [3, 3, 3, 3]}),  # generic tap loop
    ((2, 4, 6, 5), (4, 1, 1, 4), {"group": 4, "pads": [0, 3, 0, 1]}),
    ((1, 2, 5, 5), (2, 1, 3, 3), {"group": 2, "pads": [4, 4, 4, 4]}),  # pads wider than the kernel
    ((1, 2, 4, 6), (2, 1, 3, 3), {"group": 2, "strides": [3, 4]}),  # stride past the kernel
]
GROUPED = [  # a few input channels per group: the direct kernel too
    ((2, 8, 9, 10), (16, 2, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),
    ((1, 9, 11, 8), (6, 3, 5, 5), {"group": 3, "pads": [2, 1, 2, 3], "strides": [2, 1]}),
    ((2, 8, 7, 12), (4, 4, 3, 3), {"group": 2, "dilations": [1, 2], "strides": [1, 2], "pads": [1, 2, 1, 2]}),
]


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("x_shape,w_shape,attrs", DEPTHWISE + GROUPED)
def test_direct_matches_ort(x_shape, w_shape, attrs, with_bias, dtype):
    rng = np.random.default_rng(sum(x_shape) + len(attrs))
    assert jit_conv.direct_fits(x_shape, w_shape, attrs["group"])
    _check(*_conv_case(rng, x_shape, w_shape, attrs, dtype, with_bias))


@needs_numba
def test_direct_jobs_split_alike(monkeypatch):
    """Several jobs (tiny BLOCK_BYTES) on both threads give what one job gives; with compiled
    kernels off the entry point declines."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 8, 9, 10)).astype(F32)
    w = rng.standard_normal((16, 1, 3, 3)).astype(F32)
    b = rng.standard_normal(16).astype(F32)
    geo = conv.geometry(x.shape[2:], (3, 3), {"pads": [1, 2, 0, 1]})
    whole = jit_conv.direct(x, w, b, geo, 8, {})
    monkeypatch.setattr(jit_conv, "BLOCK_BYTES", 100)
    monkeypatch.setattr(jit_conv, "PARALLEL_BYTES", 0)
    np.testing.assert_array_equal(jit_conv.direct(x, w, b, geo, 8, {}), whole)
    with jit.disabled():
        assert jit_conv.direct(x, w, b, geo, 8, {}) is None
        reference = conv.conv_forward(x, w, b, {"pads": [1, 2, 0, 1], "group": 8})
    np.testing.assert_allclose(whole, reference, rtol=1e-5, atol=1e-5)


DENSE = [  # small dense convolutions (SMALL_DENSE and PHASED_DENSE plans)
    ((4, 24, 8, 8), (24, 24, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((3, 5, 9, 11), (7, 5, 3, 3), {"pads": [1, 0, 2, 1]}),
    ((2, 6, 13, 15), (5, 6, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 3, 11, 12), (4, 3, 5, 4), {"strides": [2, 3], "pads": [2, 1, 0, 3]}),
    ((1, 4, 10, 13), (3, 4, 3, 3), {"dilations": [2, 3], "pads": [2, 3, 1, 0]}),
    ((2, 3, 12, 9), (6, 3, 3, 2), {"dilations": [2, 1], "strides": [3, 2], "pads": [0, 1, 1, 0]}),
    ((1, 3, 7, 9), (4, 3, 3, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ((2, 2, 5, 4), (3, 2, 5, 4), {}),  # one output pixel
]


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("x_shape,w_shape,attrs", DENSE)
def test_small_dense_matches_ort(x_shape, w_shape, attrs, with_bias, dtype):
    rng = np.random.default_rng(sum(x_shape) + sum(w_shape))
    kind = conv.conv_plan(x_shape, np.dtype(dtype), w_shape, attrs, None).kind
    assert kind in (conv.SMALL_DENSE, conv.PHASED_DENSE, conv.TAPS_DENSE, conv.GENERIC)
    _check(*_conv_case(rng, x_shape, w_shape, attrs, dtype, with_bias))


@needs_numba
def test_small_dense_declines_large_columns(monkeypatch):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 6, 13, 15)).astype(F32)
    w = rng.standard_normal((5, 6, 3, 3)).astype(F32)
    geo = conv.geometry(x.shape[2:], (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]})
    assert jit_conv.small_dense(x, w, None, geo, {}) is not None
    monkeypatch.setattr(jit_conv, "SMALL_DENSE_BYTES", 1000)
    assert jit_conv.small_dense(x, w, None, geo, {}) is None


ACTIVATIONS = [("Relu", []), ("Clip", [-0.4, 0.7]), ("HardSigmoid", [0.3, 0.4]), ("LeakyRelu", [0.15]),
               ("LeakyRelu", [2.5]), ("Sigmoid", [])]
SHAPES = [  # one per compiled path: depthwise, small dense, pointwise, pointwise one pixel
    ((2, 6, 9, 7), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),
    ((2, 4, 9, 7), (5, 4, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 1]}),
    ((2, 4, 9, 7), (5, 4, 1, 1), {}),
    ((3, 4, 1, 1), (5, 4, 1, 1), {}),
]


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("activation,params", ACTIVATIONS)
@pytest.mark.parametrize("x_shape,w_shape,attrs", SHAPES)
def test_fused_conv_activations_match_ort(x_shape, w_shape, attrs, activation, params, dtype):
    rng = np.random.default_rng(3)
    attrs = {**attrs, "activation": activation, **({"activation_params": params} if params else {})}
    _check(*_conv_case(rng, x_shape, w_shape, attrs, dtype, op="FusedConv"))


@pytest.mark.parametrize("x_shape,w_shape,attrs", SHAPES)
def test_fused_conv_residual_then_activation(x_shape, w_shape, attrs):
    """FusedConv's sum input joins before the activation: compiled paths then run without it."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal(x_shape).astype(F32)
    inits = {"w": rng.standard_normal(w_shape).astype(F32), "b": rng.standard_normal(w_shape[0]).astype(F32)}
    geo = conv.geometry(x_shape[2:], w_shape[2:], attrs)
    z = rng.standard_normal((x_shape[0], w_shape[0]) + geo.out).astype(F32)
    node = helper.make_node("FusedConv", ["x", "w", "b", "z"], ["y"], domain=MS, activation="HardSigmoid",
                            activation_params=[0.3, 0.4], **attrs)
    _check(_model([node], {"x": x, "z": z}, inits, F32), {"x": x, "z": z})


EPILOGUES = {  # elementwise readers merged into the convolution (ConvEpilogue)
    "hardswish": [helper.make_node("HardSwish", ["c"], ["y"])],
    "hardsigmoid_mul": [helper.make_node("HardSigmoid", ["c"], ["h"], alpha=0.2, beta=0.45),
                        helper.make_node("Mul", ["h", "c"], ["y"])],
    "relu": [helper.make_node("Relu", ["c"], ["y"])],
    "clip": [helper.make_node("Clip", ["c", "lo", "hi"], ["y"])],
    "clip_low": [helper.make_node("Clip", ["c", "lo"], ["y"])],
    "leaky": [helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.3)],
    "affine": [helper.make_node("Mul", ["lo", "c"], ["m"]), helper.make_node("Add", ["m", "hi"], ["y"])],
    "hardswish_affine": [helper.make_node("HardSigmoid", ["c"], ["h"], alpha=1 / 6, beta=0.5),
                         helper.make_node("Mul", ["c", "h"], ["s"]), helper.make_node("Mul", ["hi", "s"], ["t"]),
                         helper.make_node("Add", ["t", "lo"], ["y"])],
    "not_fused": [helper.make_node("Mul", ["c", "lo"], ["m"]), helper.make_node("Sigmoid", ["m"], ["y"])],
}


@pytest.mark.parametrize("name", sorted(EPILOGUES))
@pytest.mark.parametrize("x_shape,w_shape,attrs", SHAPES)
def test_conv_epilogues_match_ort(x_shape, w_shape, attrs, name):
    rng = np.random.default_rng(4)
    model, feeds, _ = _conv_case(rng, x_shape, w_shape, attrs, tail=EPILOGUES[name])
    bounds = [numpy_helper.from_array(np.array(-0.5, F32), "lo"), numpy_helper.from_array(np.array(0.6, F32), "hi")]
    model.graph.initializer.extend(bounds)
    program = lower_graph(import_graph(model), has_kernel, allow_fallback=False)
    executor = Executor(program.steps, program.weights, program.opset, program.islands, ["y"])
    assert [step.key[1] for step in executor._steps] == ["ConvEpilogue"]
    _check(model, feeds)


def test_known_activations_of_epilogue_programs():
    def op(name, args, **attrs):
        return {"op": name, "domain": "", "args": args, "attrs": attrs}

    lo, hi = np.array(-1.5, F32), np.array(2.0, F32)
    hard_swish = [op("HardSigmoid", [0], alpha=0.25), op("Mul", [-1, 0])]
    assert _known_activation([op("HardSwish", [0])], ()) == (jit_conv.HARD_SWISH, (1 / 6, 0.5), None)
    assert _known_activation(hard_swish, ()) == (jit_conv.HARD_SWISH, (0.25, 0.5), None)
    assert _known_activation([op("Clip", [0, 1, 2])], (lo, hi)) == (jit_conv.CLIP, (-1.5, 2.0), None)
    assert _known_activation([op("Clip", [0, None, 1])], (hi,)) == (jit_conv.CLIP, (-np.inf, 2.0), None)
    # PP-OCR's learned affine after HardSwish, and a bare affine
    assert _known_activation(hard_swish + [op("Mul", [1, -2]), op("Add", [-3, 2])], (hi, lo)) == (
        jit_conv.HARD_SWISH, (0.25, 0.5), (2.0, -1.5))
    assert _known_activation([op("Add", [0, 1]), op("Mul", [2, -1])], (lo, hi)) == (
        jit_conv.IDENTITY, (0.0, 0.0), (2.0, -3.0))
    assert _known_activation([op("LeakyRelu", [0], alpha=2.0)], ()) is None  # the max form is wrong there
    assert _known_activation([op("HardSigmoid", [0]), op("Mul", [-1, 1])], (lo,)) == (
        jit_conv.HARD_SIGMOID, (0.2, 0.5), (-1.5, 0.0))  # hardsigmoid(x) * s, not x * hardsigmoid(x)
    assert _known_activation([op("Relu", [0]), op("Mul", [0, 1])], (lo,)) is None  # not the previous result
    assert _known_activation([op("Relu", [0]), op("Neg", [-1])], ()) is None
    assert _known_activation([op("Sigmoid", [0])], ()) is None


@needs_numba
@pytest.mark.parametrize("code,params", [(jit_conv.RELU, (0, 0)), (jit_conv.CLIP, (-0.5, 0.5)),
                                         (jit_conv.HARD_SIGMOID, (0.2, 0.5)), (jit_conv.HARD_SWISH, (1 / 6, 0.5)),
                                         (jit_conv.LEAKY_RELU, (0.1, 0))])
@pytest.mark.parametrize("path", ["depthwise", "dense", "pointwise"])
def test_nan_and_inf_propagate_as_in_numpy(code, params, path):
    """The compiled activations compare, never min/max: NaN and Inf come out as NumPy's forms of
    the activations give them on ORT's convolution (which reads each pixel only where its window
    does: the NumPy depthwise path's band GEMM spreads a NaN further, so it is not the reference)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 6, 7)).astype(F32)
    x[0, 1, 2, 3], x[1, 2, 0, 0], x[1, 0, 5, 6] = np.nan, np.inf, -np.inf
    names = {jit_conv.RELU: "Relu", jit_conv.CLIP: "Clip", jit_conv.HARD_SIGMOID: "HardSigmoid",
             jit_conv.LEAKY_RELU: "LeakyRelu"}
    if code == jit_conv.HARD_SWISH:
        def numpy_form(block):
            gate = np.clip(block * F32(params[0]) + F32(params[1]), 0, 1)
            with np.errstate(invalid="ignore"):  # -inf * 0
                np.multiply(block, gate, out=block)
    else:
        def numpy_form(block):
            conv.apply_activation(block, names[code], list(params))
    w_shape, attrs = {"depthwise": ((3, 1, 3, 3), {"group": 3, "pads": [1, 1, 1, 1]}),
                      "dense": ((4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
                      "pointwise": ((4, 3, 1, 1), {})}[path]
    w = rng.standard_normal(w_shape).astype(F32)
    b = rng.standard_normal(w_shape[0]).astype(F32)
    model = _model([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], {"x": x}, {"w": w, "b": b}, F32)
    expected = ort_session(model).run(["y"], {"x": x})[0]
    numpy_form(expected)
    compiled = conv.conv_forward(x, w, b, attrs, memo={}, epilogue=jit_conv.FusedActivation(code, params, numpy_form))
    assert np.isnan(expected).any()  # (bounded activations turn the infinities finite)
    np.testing.assert_array_equal(np.isnan(compiled), np.isnan(expected))
    np.testing.assert_array_equal(np.isinf(compiled), np.isinf(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(compiled[finite], expected[finite], rtol=1e-5, atol=1e-5)


@needs_numba
def test_pointwise_column_blocks(monkeypatch):
    """Large pointwise outputs run in (image, column block) items: bias and activation per block."""
    rng = np.random.default_rng(6)
    monkeypatch.setattr(conv, "POINTWISE_BLOCK_BYTES", 64)
    x = rng.standard_normal((2, 5, 30, 31)).astype(F32)
    w = rng.standard_normal((7, 5, 1, 1)).astype(F32)
    b = rng.standard_normal(7).astype(F32)
    fused = jit_conv.FusedActivation(jit_conv.HARD_SWISH, (1 / 6, 0.5), lambda block: None)
    y = conv.conv_forward(x, w, b, {}, memo={}, epilogue=fused)
    z = np.einsum("mc,nchw->nmhw", w[:, :, 0, 0].astype(F64), x.astype(F64)) + b.reshape(1, 7, 1, 1)
    expected = z * np.clip(z / 6 + 0.5, 0, 1)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)


def test_other_dtypes_keep_the_numpy_paths():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 3, 5, 5)).astype(np.float16)
    w = rng.standard_normal((3, 1, 3, 3)).astype(np.float16)
    geo = conv.geometry(x.shape[2:], (3, 3), {"pads": [1, 1, 1, 1]})
    assert jit_conv.direct(x, w, None, geo, 3, {}) is None
    assert jit_conv.small_dense(x, w[:, :, :, :].repeat(3, axis=1), None, geo, {}) is None
    assert not jit_conv.bias_and_epilogue(np.zeros((3, 4), np.float16), None, None, 0, 3)
    y = conv.conv_forward(x, w, None, {"pads": [1, 1, 1, 1], "group": 3})
    assert y.dtype == np.float16 and y.shape == (1, 3, 5, 5)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("x_shape,w_shape,attrs", [
    ((1, 6, 5, 7), (6, 4, 2, 2), {"strides": [2, 2]}),
    ((2, 4, 3, 5), (4, 1, 2, 3), {"strides": [2, 3]}),
    ((2, 6, 4, 3), (6, 2, 3, 2), {"strides": [3, 2], "group": 3}),
])
def test_conv_transpose_patches_match_ort(x_shape, w_shape, attrs, with_bias, dtype):
    """ConvTranspose with stride == kernel: one GEMM, then the patches interleaved (compiled)."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal(x_shape)
    inits = {"w": rng.standard_normal(w_shape)}
    if with_bias:
        inits["b"] = rng.standard_normal(w_shape[1] * attrs.get("group", 1))
    node = helper.make_node("ConvTranspose", ["x", *inits], ["y"], **attrs)

    def model(as_type):
        return _model([node], {"x": x.astype(as_type)}, {k: v.astype(as_type) for k, v in inits.items()}, as_type)

    _check(model(dtype), {"x": x.astype(dtype)}, model(F32))

