"""Elementwise chains: the lowering fusion (compiler/lower_fuse.py), the chunked in-place kernel
(runtime/kernels/chain.py) and the executor's buffer donation that lets it write in place."""

import numpy as np
import pytest
from onnx import helper

from infc.compiler.runtime.executor import Executor
from infc.compiler.runtime.kernels import chain
from infc.compiler.runtime.kernels.common import KernelContext

F32 = np.float32
HARDSWISH_AFFINE = [
    {"op": "HardSigmoid", "domain": "", "args": [0], "attrs": {"alpha": 1 / 6, "beta": 0.5}},
    {"op": "Mul", "domain": "", "args": [0, -1], "attrs": {}},
    {"op": "Mul", "domain": "", "args": [1, -2], "attrs": {}},
    {"op": "Add", "domain": "", "args": [-3, 2], "attrs": {}},
]


def _run(inputs, ops, out=None):
    ctx = KernelContext(17, [out])
    return chain.elementwise_chain(inputs, {"ops": ops}, ctx)[0], ctx


@pytest.mark.parametrize("shape", [(2, 3, 4), (1, 96, 40, 40), (3, 70, 33, 29)])  # one chunk, chunks along C, along N and C
def test_chunked_chain_matches_op_by_op(shape, rng):
    x = rng.standard_normal(shape).astype(F32) * 4
    inputs = [x, np.array([1.5], F32), np.array([-0.25], F32)]
    got, ctx = _run(inputs, HARDSWISH_AFFINE)
    expected = chain._op_by_op(inputs, HARDSWISH_AFFINE, ctx)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    hs = np.clip(x / 6 + 0.5, 0, 1)
    np.testing.assert_allclose(got, x * hs * 1.5 - 0.25, rtol=1e-5, atol=1e-5)


def test_broadcast_operands_slice_with_the_chunks(rng):
    x = rng.standard_normal((2, 64, 45, 45)).astype(F32)
    scale, residual = rng.standard_normal((64, 1, 1)).astype(F32), rng.standard_normal((2, 64, 45, 45)).astype(F32)
    per_image = rng.standard_normal((2, 1, 1, 1)).astype(F32)
    # args: >= 0 the chain's inputs, -1 - k the result of op k
    ops = [{"op": "Mul", "args": [0, 1]}, {"op": "Add", "args": [-1, 2]}, {"op": "Sub", "args": [3, -2]},
           {"op": "Relu", "args": [-3]}, {"op": "Div", "args": [-4, 3]}]
    got, _ = _run([x, scale, residual, per_image], ops)
    np.testing.assert_allclose(got, np.maximum(per_image - (x * scale + residual), 0) / per_image, rtol=1e-5, atol=1e-6)


def test_writes_into_the_donated_buffer(rng):
    x = rng.standard_normal((1, 8, 100, 100)).astype(F32)
    expected, _ = _run([x.copy(), np.array([2], F32), np.array([1], F32)], HARDSWISH_AFFINE)
    donated = x.copy()
    got, _ = _run([donated, np.array([2], F32), np.array([1], F32)], HARDSWISH_AFFINE, out=donated)
    assert got is donated
    np.testing.assert_array_equal(got, expected)


def test_other_dtypes_and_small_operand_pairs_run_op_by_op(rng):
    ints = [np.arange(6, dtype=np.int64).reshape(2, 3), np.array(2, np.int64)]
    got, _ = _run(ints, [{"op": "Mul", "args": [0, 1]}, {"op": "Add", "args": [-1, 1]}])
    np.testing.assert_array_equal(got, np.arange(6).reshape(2, 3) * 2 + 2)
    # the first op only sees broadcast operands: its result is smaller than the chain's output
    a, b, c = np.ones((3, 1), F32), np.ones((1, 4), F32), rng.standard_normal((3, 4)).astype(F32)
    got, _ = _run([a, b, c], [{"op": "Add", "args": [0, 1]}, {"op": "Mul", "args": [-1, 2]}])
    np.testing.assert_allclose(got, 2 * c)


def _hardswish_affine_model(extra_consumer=False, int_add=False):
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("HardSigmoid", ["r"], ["h"], alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["r", "h"], ["m"]),
             helper.make_node("Mul", ["s", "m"], ["ms"]),
             helper.make_node("Add", ["ms", "b"], ["y"])]
    outputs = [("y", F32)]
    if extra_consumer:  # "m" read outside the run: the chain must stop there
        nodes.append(helper.make_node("Neg", ["m"], ["z"]))
        outputs.append(("z", F32))
    if int_add:
        nodes += [helper.make_node("Add", ["i", "i"], ["i2"]), helper.make_node("Mul", ["i2", "i"], ["i3"])]
        outputs.append(("i3", np.int64))
    return nodes, outputs


def _lowered(graph_of, nodes, outputs, feeds):
    from infc.compiler.graph import import_graph
    from infc.compiler.lower import lower_graph
    from infc.compiler.runtime.kernels import has_kernel

    model = graph_of(nodes, feeds, outputs, {"s": np.array([1.5], F32), "b": np.array([0.25], F32)})
    return model, lower_graph(import_graph(model), has_kernel)


def test_lowering_fuses_the_run_into_one_chain_step(graph_of, ort_check, rng):
    feeds = {"x": rng.standard_normal((1, 16, 30, 30)).astype(F32)}
    nodes, outputs = _hardswish_affine_model()
    model, program = _lowered(graph_of, nodes, outputs, feeds)
    assert [s["op"] for s in program.steps] == ["Relu", "ElementwiseChain"]
    fused = program.steps[1]
    assert [o["op"] for o in fused["attrs"]["ops"]] == ["HardSigmoid", "Mul", "Mul", "Add"]
    assert fused["inputs"] == ["r", "s", "b"] and fused["outputs"] == ["y"]
    ort_check(model, feeds)


def test_values_read_elsewhere_and_integer_runs_are_not_fused(graph_of, ort_check, rng):
    feeds = {"x": rng.standard_normal((2, 8, 5, 5)).astype(F32), "i": np.arange(6, dtype=np.int64)}
    nodes, outputs = _hardswish_affine_model(extra_consumer=True, int_add=True)
    model, program = _lowered(graph_of, nodes, outputs, feeds)
    chains = [[o["op"] for o in s["attrs"]["ops"]] for s in program.steps if s["op"] == "ElementwiseChain"]
    assert chains == [["HardSigmoid", "Mul"], ["Mul", "Add"]]  # split at "m", which Neg reads too
    assert {"Add", "Mul"} <= {s["op"] for s in program.steps}  # the int64 pair stays as it was
    ort_check(model, feeds)


def test_donation_never_touches_feeds_weights_or_kept_values(rng):
    steps = [{"op": "Relu", "domain": "", "inputs": ["x"], "outputs": ["a"], "attrs": {}},
             {"op": "ElementwiseChain", "domain": "infc.cpu", "inputs": ["a", "w"], "outputs": ["b"],
              "attrs": {"ops": [{"op": "Mul", "args": [0, 1]}, {"op": "Add", "args": [-1, 1]}]}},
             {"op": "Add", "domain": "", "inputs": ["b", "w"], "outputs": ["c"], "attrs": {}},
             {"op": "Add", "domain": "", "inputs": ["x", "w"], "outputs": ["d"], "attrs": {}}]
    w = np.full((4,), 2, F32)
    executor = Executor(steps, {"w": w}, opset=17, output_names=["b", "c", "d"])
    x = rng.standard_normal((3, 4)).astype(F32)
    x_before = x.copy()
    out = executor.run({"x": x})
    np.testing.assert_array_equal(x, x_before)
    np.testing.assert_array_equal(w, np.full((4,), 2, F32))
    np.testing.assert_allclose(out["b"], np.maximum(x, 0) * 2 + 2)
    np.testing.assert_allclose(out["c"], out["b"] + 2)  # "b" is an output: the last Add may not reuse it
    np.testing.assert_allclose(out["d"], x + 2)
    assert executor._steps[1].donors == (0,) and executor._steps[2].donors == () and executor._steps[3].donors == ()


def test_donation_accepts_only_buffers_nobody_else_sees():
    from infc.compiler.runtime.executor import _donation

    def offer(make):  # the executor's references: a values slot and the argument list
        slots = [make()]
        args = [slots[0]]
        return _donation(args, (0,)) is not None

    assert offer(lambda: np.ones((2, 3), F32))
    assert offer(lambda: np.ones((2, 3), F32).reshape(3, 2))  # a whole-buffer view of a fresh array
    held = np.ones((2, 3), F32)
    assert not offer(lambda: held)  # someone else holds it
    assert not offer(lambda: held.reshape(3, 2))  # a view of something someone else holds
    assert not offer(lambda: np.ones((4, 3), F32)[:2])  # part of a buffer
    assert not offer(lambda: np.broadcast_to(np.ones(3, F32), (2, 3)))  # read-only
    assert not offer(lambda: np.ones((3, 2), F32).T)  # not C-contiguous
