"""ExpertMatMul: a mixture of experts' Gather(W, idx) -> MatMul pair, fused at lowering into one GEMM
per expert (compiler/lower_experts.py, runtime/kernels/expert_gemm.py). The same products as the
gather and the batched MatMul; rows invariant to how many others reach their expert where a decoder
plan asks for it; built plans of an exported MoE block match onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from infc.compiler.build import BuildOptions, build
from infc.compiler.plan.format import read_plan
from infc.compiler.runtime.kernels import kernel_for
from infc.compiler.runtime.kernels.common import KernelContext
from infc.compiler.runtime.session import PlanSession
from infc.compiler.verify import ort_session

EXPERTS, K, N = 5, 96, 80
STEP = kernel_for("infc.cpu", "ExpertMatMul")


def _case(rows: int, p: int, side: int, seed: int = 0):
    """(x, idx, stored [E, K, N] weight, the unfused result) for one form."""
    rng = np.random.default_rng(seed)
    original = rng.standard_normal((EXPERTS, N, K) if side == 0 else (EXPERTS, K, N)).astype(np.float32)
    idx = rng.integers(-EXPERTS, EXPERTS - 1, rows)  # negative indices count from the end; expert E-1 never chosen
    x = rng.standard_normal((rows, K, p) if side == 0 else (rows, p, K)).astype(np.float32)
    gathered = original[idx]
    want = np.matmul(gathered, x) if side == 0 else np.matmul(x, gathered)
    stored = np.ascontiguousarray(np.swapaxes(original, -1, -2)) if side == 0 else original
    return x, idx, stored, want


@pytest.mark.parametrize("side,p", [(0, 1), (1, 1), (0, 3), (1, 2)])
@pytest.mark.parametrize("invariant", [0, 1])
def test_grouped_products_equal_the_gather_and_batched_matmul(side, p, invariant):
    x, idx, stored, want = _case(41, p, side)
    (got,) = STEP([x, idx, stored], {"weights_side": side, "batch_invariant": invariant}, KernelContext(17))
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-4)


def test_a_row_is_the_same_bits_alone_and_among_others_when_invariant():
    """Decoder plans: a token's expert output must not change with the other tokens in the step (here
    its expert gets 1 row alone, up to 23 together)."""
    x, idx, stored, _ = _case(64, 1, 0, seed=3)
    attrs = {"weights_side": 0, "batch_invariant": 1}
    ctx = KernelContext(17)
    (together,) = STEP([x, idx, stored], attrs, ctx)
    for i in (0, 17, 63):
        (alone,) = STEP([x[i:i + 1], idx[i:i + 1], stored], attrs, ctx)
        assert np.array_equal(alone[0], together[i])
        (few,) = STEP([x[i:i + 5], idx[i:i + 5], stored], attrs, ctx)
        assert np.array_equal(few[0], together[i])


def test_shapes_outside_the_grouped_form_keep_the_gather_semantics():
    """x broadcast over the gathered stack (one operand for every routed matrix) is not the grouped
    form: the kernel gathers and multiplies, as the two steps did."""
    x, idx, stored, _ = _case(7, 1, 1)
    shared = x[:1]
    (got,) = STEP([shared, idx, stored], {"weights_side": 1}, KernelContext(17))
    np.testing.assert_allclose(got, np.matmul(shared, stored[idx]), rtol=1e-6)


def test_depth_one_gather_nd_indices_route_as_gather_indices():
    x, idx, stored, want = _case(9, 1, 1)
    (got,) = STEP([x, idx[:, None], stored], {"weights_side": 1, "index_depth": 1}, KernelContext(17))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-4)
    with pytest.raises(ValueError, match="depth 1"):
        STEP([x, np.stack([idx, idx], -1), stored], {"weights_side": 1, "index_depth": 1}, KernelContext(17))


def test_an_expert_index_out_of_range_is_an_error():
    x, idx, stored, _ = _case(4, 1, 1)
    with pytest.raises(IndexError, match="outside"):
        STEP([x, np.array([0, 1, EXPERTS, 2]), stored], {"weights_side": 1}, KernelContext(17))


def _gather(weight: str, out: str, nd: bool) -> list:
    """TorchScript's Gather of the routed experts' weights, or dynamo's GatherND of [R, 1] indices."""
    if not nd:
        return [helper.make_node("Gather", [weight, "idx"], [out], axis=0)]
    return [helper.make_node("Unsqueeze", ["idx", "k_axis"], [f"{out}_index"]),
            helper.make_node("GatherND", [weight, f"{out}_index"], [out], batch_dims=0)]


def _moe_model(path, nd: bool = False):
    """The batched-MM export's MoE block: top-2 routing, each routed row by its expert's gathered
    gate/up weight [E, 2I, H] (column form), SiLU-gated, then by the gathered down weight [E, H, I]."""
    rng = np.random.default_rng(11)
    hidden, inter, experts = 32, 24, 4
    inits = [numpy_helper.from_array((rng.standard_normal((hidden, experts)) / 4).astype(np.float32), "router"),
             numpy_helper.from_array((rng.standard_normal((experts, 2 * inter, hidden)) / 6).astype(np.float32), "gate_up"),
             numpy_helper.from_array((rng.standard_normal((experts, hidden, inter)) / 5).astype(np.float32), "down"),
             numpy_helper.from_array(np.array([2], np.int64), "k"),
             numpy_helper.from_array(np.array([-1], np.int64), "flat"),
             numpy_helper.from_array(np.array([1, 2, 1], np.int64), "repeat"),
             numpy_helper.from_array(np.array([-1, hidden, 1], np.int64), "as_column"),
             numpy_helper.from_array(np.array([-1, 2 * inter], np.int64), "gu_rows"),
             numpy_helper.from_array(np.array([-1, inter, 1], np.int64), "as_column_i"),
             numpy_helper.from_array(np.array([-1, hidden], np.int64), "h_rows"),
             numpy_helper.from_array(np.array([inter, inter], np.int64), "halves")]
    nodes = [
        helper.make_node("MatMul", ["x", "router"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
        helper.make_node("TopK", ["probs", "k"], ["top_p", "top_i"], axis=-1),
        helper.make_node("Reshape", ["top_i", "flat"], ["idx"]),
        helper.make_node("Unsqueeze", ["x", "k_axis"], ["x3"]),  # [T, 1, H]
        helper.make_node("Tile", ["x3", "repeat"], ["x_rep"]),  # [T, 2, H]
        helper.make_node("Reshape", ["x_rep", "as_column"], ["x_col"]),  # [2T, H, 1]
        *_gather("gate_up", "w_gu", nd),
        helper.make_node("MatMul", ["w_gu", "x_col"], ["gu3"]),  # [2T, 2I, 1]
        helper.make_node("Reshape", ["gu3", "gu_rows"], ["gu"]),
        helper.make_node("Split", ["gu", "halves"], ["g", "u"], axis=-1),
        helper.make_node("Sigmoid", ["g"], ["sg"]),
        helper.make_node("Mul", ["g", "sg"], ["silu"]),
        helper.make_node("Mul", ["silu", "u"], ["act"]),
        helper.make_node("Reshape", ["act", "as_column_i"], ["act_col"]),
        *_gather("down", "w_d", nd),
        helper.make_node("MatMul", ["w_d", "act_col"], ["d3"]),  # [2T, H, 1]
        helper.make_node("Reshape", ["d3", "h_rows"], ["d"]),
        helper.make_node("Reshape", ["top_p", "flat"], ["p_flat"]),
        helper.make_node("Unsqueeze", ["p_flat", "k_axis"], ["p_col"]),
        helper.make_node("Mul", ["d", "p_col"], ["weighted"]),
        helper.make_node("Reshape", ["weighted", "t2h"], ["per_token"]),  # [T, 2, H]
        helper.make_node("ReduceSum", ["per_token", "k_axis"], ["y"], keepdims=0),
    ]
    inits += [numpy_helper.from_array(np.array([1], np.int64), "k_axis"),
              numpy_helper.from_array(np.array([-1, 2, hidden], np.int64), "t2h")]
    graph = helper.make_graph(nodes, "moe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["t", hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["t", hidden])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.mark.parametrize("nd", [False, True])
def test_a_moe_block_builds_into_expert_gemms_and_matches_onnxruntime(tmp_path, nd):
    model = _moe_model(tmp_path / "moe.onnx", nd)
    profile = tmp_path / "p.yaml"
    profile.write_text("inputs:\n  x: {min: [1, 32], opt: [16, 32], max: [64, 32]}\n")
    plan = tmp_path / "moe.plan"
    build(str(model), str(profile), str(plan), BuildOptions(use_cache=False, show_progress=False, allow_fallback=False))
    meta = read_plan(plan).meta
    experts = [s for s in meta["program"] if s["op"] == "ExpertMatMul"]
    assert len(experts) == 2 and not any(s["op"] in ("Gather", "GatherND") for s in meta["program"]), \
        [s["op"] for s in meta["program"]]
    assert {s["attrs"]["weights_side"] for s in experts} == {0}
    session, reference = PlanSession(plan), ort_session(onnx.load(model))
    for t in (1, 16, 64):
        feeds = {"x": np.random.default_rng(t).standard_normal((t, 32)).astype(np.float32)}
        np.testing.assert_allclose(session.run(feeds)["y"], reference.run(["y"], feeds)[0], rtol=1e-5, atol=1e-5)
