"""Convolutions merged at load with the elementwise step that reads them (kernels/conv_epilogue.py):
numerics against onnxruntime, and the cases that must stay unmerged."""

import numpy as np
import onnx
import pytest
from infc.compiler.graph import import_graph
from infc.compiler.lower import lower_graph
from infc.compiler.runtime.executor import Executor
from infc.compiler.runtime.kernels import has_kernel
from onnx import helper

F32 = np.float32
MS = "com.microsoft"


def _typed(model):
    return onnx.shape_inference.infer_shapes(model)  # value types let lowering chain an elementwise run


def _executor(model):
    program = lower_graph(import_graph(model), has_kernel, allow_fallback=False)
    return Executor(program.steps, program.weights, program.opset, program.islands, [o["name"] for o in program.outputs])


def _ops(executor):
    return [step.key[1] for step in executor._steps]


def _conv_then(tail_nodes, rng, conv_op="Conv", conv_attrs=None, w_shape=(6, 4, 3, 3), extra_inits=None, x_shape=(2, 4, 9, 9)):
    group = (conv_attrs or {}).get("group", 1)
    inits = {"w": rng.standard_normal(w_shape).astype(F32), "b": rng.standard_normal(w_shape[0]).astype(F32),
             "three": np.array(3.0, F32), "sixth": np.array([1 / 6], F32), "scale": np.array([1.5], F32),
             "shift": np.array(-0.25, F32), **(extra_inits or {})}
    conv = helper.make_node(conv_op, ["x", "w", "b"], ["c"], domain=MS if conv_op == "FusedConv" else None,
                            pads=[1, 1, 1, 1], group=group, **{k: v for k, v in (conv_attrs or {}).items() if k != "group"})
    x = rng.standard_normal(x_shape).astype(F32)
    return [conv, *tail_nodes], {"x": x}, inits


HARD_SWISH_AFFINE = [  # HardSwish written out, then a learned scalar affine (PP-OCR's activation)
    helper.make_node("HardSigmoid", ["c"], ["h"], alpha=1 / 6, beta=0.5),
    helper.make_node("Mul", ["c", "h"], ["s"]),
    helper.make_node("Mul", ["scale", "s"], ["t"]),
    helper.make_node("Add", ["t", "shift"], ["y"]),
]


@pytest.mark.parametrize("conv_attrs,w_shape", [
    ({}, (6, 4, 3, 3)),                        # small dense
    ({"group": 4}, (4, 1, 3, 3)),              # depthwise
    ({}, (3, 4, 1, 1)),                        # pointwise
    ({"strides": [2, 2]}, (6, 4, 3, 3)),       # strided dense
])
def test_chain_epilogue_matches_ort(conv_attrs, w_shape, rng, graph_of, ort_check):
    nodes, feeds, inits = _conv_then(HARD_SWISH_AFFINE, rng, conv_attrs=conv_attrs, w_shape=w_shape)
    model = _typed(graph_of(nodes, feeds, [("y", F32)], inits))
    assert _ops(_executor(model)) == ["ConvEpilogue"]
    ort_check(model, feeds)


@pytest.mark.parametrize("activation,params", [("Relu", []), ("LeakyRelu", [2.5]), ("HardSigmoid", [0.2, 0.5])])
def test_fused_conv_activation_runs_before_the_epilogue(activation, params, rng, graph_of, ort_check):
    attrs = {"activation": activation, **({"activation_params": params} if params else {})}
    nodes, feeds, inits = _conv_then([helper.make_node("Mul", ["c", "scale"], ["y"])], rng, "FusedConv", attrs)
    model = _typed(graph_of(nodes, feeds, [("y", F32)], inits))
    assert _ops(_executor(model)) == ["ConvEpilogue"]
    ort_check(model, feeds)


def test_single_step_and_sum_input(rng, graph_of, ort_check):
    x = rng.standard_normal((1, 4, 6, 6)).astype(F32)
    z = rng.standard_normal((1, 5, 6, 6)).astype(F32)
    inits = {"w": rng.standard_normal((5, 4, 3, 3)).astype(F32), "b": rng.standard_normal(5).astype(F32),
             "lo": np.array(-0.3, F32), "hi": np.array(0.4, F32)}
    nodes = [helper.make_node("FusedConv", ["x", "w", "b", "z"], ["c"], domain=MS, pads=[1, 1, 1, 1], activation="Tanh"),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    model = _typed(graph_of(nodes, {"x": x, "z": z}, [("y", F32)], inits))
    assert _ops(_executor(model)) == ["ConvEpilogue"]
    ort_check(model, {"x": x, "z": z})


def test_unmergeable_readers_stay_apart(rng, graph_of, ort_check):
    per_channel = {"gain": rng.standard_normal((1, 6, 1, 1)).astype(F32)}
    nodes, feeds, inits = _conv_then([helper.make_node("Mul", ["c", "gain"], ["y"])], rng, extra_inits=per_channel)
    model = _typed(graph_of(nodes, feeds, [("y", F32)], inits))
    assert _ops(_executor(model)) == ["Conv", "Mul"]  # not a scalar operand
    ort_check(model, feeds)
    nodes, feeds, inits = _conv_then([helper.make_node("Relu", ["c"], ["y"]),
                                      helper.make_node("Neg", ["c"], ["n"])], rng)
    model = _typed(graph_of(nodes, feeds, [("y", F32), ("n", F32)], inits))
    assert _ops(_executor(model)) == ["Conv", "Relu", "Neg"]  # read twice
    nodes, feeds, inits = _conv_then([helper.make_node("Relu", ["c"], ["y"])], rng)
    model = _typed(graph_of(nodes, feeds, [("y", F32), ("c", F32)], inits))
    assert _ops(_executor(model)) == ["Conv", "Relu"]  # the convolution's output is a graph output
    ort_check(model, feeds)


def test_an_observer_sees_the_program_as_planned(rng, graph_of):
    nodes, feeds, inits = _conv_then(HARD_SWISH_AFFINE, rng)
    model = _typed(graph_of(nodes, feeds, [("y", F32)], inits))
    program = lower_graph(import_graph(model), has_kernel)
    seen = []
    executor = Executor(program.steps, program.weights, program.opset, observer=lambda name, value: seen.append(name))
    executor.run(feeds)
    assert "c" in seen and "ConvEpilogue" not in _ops(executor)


@pytest.mark.parametrize("conv_attrs,w_shape,x_shape", [
    ({}, (6, 4, 3, 3), (2, 4, 9, 9)),                       # small dense
    ({"group": 4}, (4, 1, 3, 3), (2, 4, 9, 9)),             # depthwise
    ({}, (24, 16, 1, 1), (1, 16, 40, 40)),                  # pointwise, blocked
    ({"strides": [2, 2]}, (6, 4, 3, 3), (2, 4, 9, 9)),      # strided dense
])
@pytest.mark.parametrize("alpha", [1.0, 1.702])
def test_silu_epilogue_matches_ort(conv_attrs, w_shape, x_shape, alpha, rng, graph_of, ort_check):
    # SiLU after a convolution (EfficientNet, YOLO): fuse/silu.py writes com.microsoft.QuickGelu,
    # which the compiled convolution kernels apply to each output block (jit_conv.SILU).
    tail = [helper.make_node("QuickGelu", ["c"], ["y"], domain=MS, alpha=alpha)]
    nodes, feeds, inits = _conv_then(tail, rng, conv_attrs=conv_attrs, w_shape=w_shape, x_shape=x_shape)
    model = graph_of(nodes, feeds, [("y", F32)], inits)
    assert _ops(_executor(model)) == ["ConvEpilogue"]
    ort_check(model, feeds, rtol=2e-6)
