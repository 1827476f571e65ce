"""gemm_as_matmul: Gemm steps with a constant weight become MatMul (+ Add) before GEMM tuning, with
the same outputs, and the tuner takes them (a bf16 plan's then run on the bf16 kernels)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from infc.compiler.build import BuildOptions, build
from infc.compiler.plan.format import read_plan
from infc.compiler.runtime.session import PlanSession
from infc.compiler.verify import compare_outputs, ort_session


def _gemm_model(path, trans_b: int, beta: float, has_bias: bool, alpha: float = 1.0):
    rng = np.random.default_rng(5)
    b = (rng.standard_normal((48, 64) if trans_b else (64, 48)) / 8).astype(np.float32)
    inits = [numpy_helper.from_array(b, "b")]
    inputs = ["x", "b"]
    if has_bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(48).astype(np.float32), "c"))
        inputs.append("c")
    node = helper.make_node("Gemm", inputs, ["y"], transB=trans_b, beta=beta, alpha=alpha)
    graph = helper.make_graph([node, helper.make_node("Concat", ["y", "y"], ["z"], axis=0)], "gemm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", 64])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 48])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.mark.parametrize("trans_b,beta,has_bias,alpha,tuned", [
    (1, 1.0, True, 1.0, True), (0, 0.5, True, 1.0, True), (1, 1.0, False, 1.0, True), (0, 1.0, True, 2.0, False)])
def test_gemm_with_a_constant_weight_is_tuned_and_matches_onnxruntime(tmp_path, trans_b, beta, has_bias, alpha, tuned):
    model = _gemm_model(tmp_path / "gemm.onnx", trans_b, beta, has_bias, alpha)
    profile = tmp_path / "p.yaml"
    profile.write_text("inputs:\n  x: {min: [2, 64], opt: [16, 64], max: [40, 64]}\n")
    plan = tmp_path / "gemm.plan"
    build(str(model), str(profile), str(plan), BuildOptions(use_cache=False, show_progress=False, allow_fallback=False))
    ops = [s["op"] for s in read_plan(plan).meta["program"]]
    assert ("TunedMatMul" in ops and "Gemm" not in ops) if tuned else ("Gemm" in ops), ops  # alpha != 1 stays Gemm
    session = PlanSession(plan)
    for m in (2, 16, 40):
        feeds = {"x": np.random.default_rng(m).standard_normal((m, 64)).astype(np.float32)}
        expected = ort_session(onnx.load(model)).run(["z"], feeds)
        diffs = compare_outputs(["z"], expected, [session.run(feeds)["z"]])
        assert max(d.max_rel_diff for d in diffs) <= 1e-5, diffs
