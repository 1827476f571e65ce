"""The whole model in one onnxruntime session as a variant of the in-context check
(compiler/tune_whole.py): offered under the size cap, checked against infc's program, kept only by
a margin, and then the plan is one island that runs, matches onnxruntime and says so in inspect."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from rich.console import Console

from infc.compiler import tune_context, tune_whole
from infc.compiler.build import BuildOptions, build
from infc.compiler.errors import BadInput
from infc.compiler.plan_report import plan_report, print_plan_report
from infc.compiler.runtime.session import PlanSession
from infc.compiler.testing import FIXTURES
from infc.compiler.verify import ort_session

PROFILES = FIXTURES.parent.parent / "profiles"


@pytest.fixture(autouse=True)
def offered(monkeypatch):
    monkeypatch.setenv("INFC_WHOLE_MODEL", "1")  # the suite turns it off (tests/conftest.py)


def test_the_whole_model_is_kept_only_by_its_margin():
    assert tune_whole.wins({"none": 1.0, "all": 0.8, tune_whole.WHOLE: 0.7})
    assert tune_whole.wins({"none": 1.0, "all": 0.397, tune_whole.WHOLE: 0.362})  # RegNetY's race: 9% is a lead
    assert not tune_whole.wins({"none": 1.0, "all": 0.71, tune_whole.WHOLE: 0.7})  # within the race's noise
    assert not tune_whole.wins({"none": 1.0})  # not raced (refused by onnxruntime, or not offered)


def test_offered_below_the_size_cap_with_tensor_io_unless_turned_off(monkeypatch):
    model = onnx.load(str(FIXTURES / "cnn_ts.onnx"))
    assert tune_whole.whole_model_bytes(model) == model.SerializeToString()
    monkeypatch.setattr(tune_whole, "WHOLE_MAX_BYTES", model.ByteSize() - 1)
    assert tune_whole.whole_model_bytes(model) is None
    monkeypatch.undo()
    monkeypatch.setenv("INFC_WHOLE_MODEL", "0")
    assert tune_whole.whole_model_bytes(model) is None
    assert BuildOptions().key_options()["whole_model"] is False  # another engine-cache key


def _build(tmp_path, monkeypatch, whole_wins: bool):
    monkeypatch.setattr(tune_context, "whole_wins", lambda medians: whole_wins and tune_whole.WHOLE in medians)
    out = tmp_path / "cnn.plan"
    report = build(str(FIXTURES / "cnn_ts.onnx"), str(PROFILES / "cnn.yaml"), str(out),
                   BuildOptions(use_cache=False, show_progress=False, cache_dir=tmp_path))
    return out, report


def test_a_plan_kept_whole_is_one_island_that_matches_onnxruntime(tmp_path, monkeypatch):
    out, report = _build(tmp_path, monkeypatch, whole_wins=True)
    assert report["conv_tactics"]["whole_model"] and report["fallback_ops"] == ["(the whole model)"]
    assert [k["op"] for k in report["kernels"]] == ["__island__"]
    feeds = {"pixel_values": np.random.default_rng(3).standard_normal((5, 3, 32, 32)).astype(np.float32)}
    expected = ort_session(onnx.load(str(FIXTURES / "cnn_ts.onnx"))).run(None, feeds)[0]
    session = PlanSession(out)
    assert session.executor._sole_island is not None  # runs straight into onnxruntime, no slots or memo
    np.testing.assert_allclose(session.run(feeds)["logits"], expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(BadInput, match="does not run at these inputs"):  # still infc's words, not a traceback
        session.run({"pixel_values": np.zeros((1, 4, 32, 32), np.float32)})
    report = plan_report(str(out))
    summary = report["onnxruntime_tactics"]
    assert summary["whole_model"] and summary["kept"] == tune_whole.WHOLE
    console = Console(record=True, width=400)
    print_plan_report(report, console)
    assert "not run by this plan" in console.export_text()  # the GEMMs tuned before the race are not its kernels


def test_a_faster_program_on_infc_kernels_keeps_them(tmp_path, monkeypatch):
    out, report = _build(tmp_path, monkeypatch, whole_wins=False)
    assert tune_whole.WHOLE in report["conv_tactics"]["program_ms"]  # raced ...
    assert "__island__" not in {k["op"] for k in report["kernels"]}  # ... and not kept


def test_a_whole_model_onnxruntime_refuses_is_not_a_variant():
    from infc.compiler.testing import lowered_and_observed

    node = helper.make_node("Relu", ["x"], ["y"])
    model = helper.make_model(helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = {"x": np.array([-1.0, 2.0], np.float32)}
    program, _ = lowered_and_observed(model, {"opt": feeds})
    summary = tune_context.confirm_in_context(program, feeds, budget_s=0.0, whole_model=tune_whole.WholeModel(b"not a model"))
    assert summary["rejected_wrong"][0].startswith(f"{tune_whole.WHOLE}: ") and not summary.get("whole_model")
    assert program.steps[0]["op"] == "Relu"


def test_the_whole_model_is_held_to_its_own_reference():
    """At fp32 the variant must agree with onnxruntime on the model as given (optimizations on: a QDQ
    model's fused int8 kernels), not with infc's program, which computes its float arithmetic."""
    from infc.compiler.testing import lowered_and_observed

    node = helper.make_node("Relu", ["x"], ["y"])
    model = helper.make_model(helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = {"x": np.array([-1.0, 2.0], np.float32)}
    program, _ = lowered_and_observed(model, {"opt": feeds})
    right = tune_whole.original_outputs(model, feeds)
    assert right is not None and np.array_equal(right["y"], [0.0, 2.0])
    for reference, is_refused in ((right, False), ({"y": np.array([0.0, 3.0], np.float32)}, True)):
        whole = tune_whole.WholeModel(model.SerializeToString(), reference=reference)
        summary = tune_context.confirm_in_context(program, feeds, budget_s=0.0, whole_model=whole)
        assert any(r.startswith(tune_whole.WHOLE) for r in summary["rejected_wrong"]) == is_refused


def _relu_model():
    node = helper.make_node("Relu", ["x"], ["y"])
    return helper.make_model(helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]),
                             opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_the_whole_model_runs_once_in_a_child_before_it_races(monkeypatch):
    """A session that kills the process (a segfault in a graph optimizer, a SIGFPE in a kernel) costs
    the variant, not the build; the child also computes the fp32 reference."""
    import os
    import signal
    import time

    model, feeds = _relu_model(), {"x": np.array([-1.0, 2.0], np.float32)}
    whole = tune_whole.WholeModel(model.SerializeToString())
    assert tune_whole.prove(whole, model, feeds) is None
    np.testing.assert_array_equal(whole.reference["y"], [0.0, 2.0])
    assert tune_whole.prove(tune_whole.WholeModel(b"not a model"), None, feeds) == "it raised an error running it on the build's inputs"
    monkeypatch.setattr(tune_whole, "_run_once", lambda model_bytes, feeds: os.kill(os.getpid(), signal.SIGFPE))
    assert tune_whole.prove(whole, None, feeds) == "onnxruntime died of SIGFPE running it on the build's inputs"
    monkeypatch.setattr(tune_whole, "_run_once", lambda model_bytes, feeds: time.sleep(30))
    assert tune_whole.prove(whole, None, feeds, timeout_s=0.5) == "it did not finish within 0.5 s running it on the build's inputs"


def test_a_reduced_precision_whole_model_is_held_to_fp32_as_closely_as_the_program():
    """fp16 / int8: the model is infc's own and rounds otherwise than its program (onnxruntime's int8
    kernels sum in integers); it must be about as close to the fp32 outputs as the program is."""
    whole = tune_whole.WholeModel(b"", is_reduced=True, reference={"y": np.array([1.0, -2.0, 4.0])})
    program = {"y": np.array([1.0, -2.0, 4.04])}  # 1% of the largest from fp32
    assert tune_whole.accuracy_refusal(whole, {"y": np.array([1.05, -2.0, 4.0])}, program, ["y"]) is None  # 1.25%
    assert tune_whole.accuracy_refusal(whole, {"y": np.array([1.0, -2.16, 4.0])}, program, ["y"]) == (
        "0.04 of the largest output from fp32, where infc's program is 0.01")
    exact = {"y": np.array([1.0, -2.0, 4.0])}  # a program on fp32's outputs still leaves the slack
    assert tune_whole.accuracy_refusal(whole, {"y": np.array([1.0, -2.0, 4.002])}, exact, ["y"]) is None


def test_an_int8_plan_offers_onnxruntime_its_qdq_model_with_int8_weights(tmp_path, monkeypatch):
    """The whole-model variant of an int8 build is the QDQ model before its weights were folded to
    fp32 constants: onnxruntime fuses DequantizeLinear(int8 W) -> Conv into its int8 QLinearConv only
    with the weight's DequantizeLinear there (folded, ResNet-50's int8 plan ran fp32 convolutions
    between fake-quantized activations: 200 ms where the QDQ model takes 108)."""
    from infc.compiler.build_precision import PrecisionSettings
    from infc.compiler.plan.format import read_plan

    monkeypatch.setattr(tune_context, "whole_wins", lambda medians: tune_whole.WHOLE in medians)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", pixel_values=rng.standard_normal((8, 4, 3, 32, 32)).astype(np.float32))
    out = tmp_path / "cnn_int8.plan"
    report = build(str(FIXTURES / "cnn_ts.onnx"), str(PROFILES / "cnn.yaml"), str(out),
                   BuildOptions(use_cache=False, show_progress=False, cache_dir=tmp_path, precision="int8",
                                precision_settings=PrecisionSettings(calib=str(tmp_path / "calib.npz"))))
    assert report["conv_tactics"]["whole_model"]
    island = onnx.load_from_string(bytes(read_plan(out).sections[tune_whole.WHOLE_SECTION]))
    int8_weights = {t.name for t in island.graph.initializer if t.data_type == TensorProto.INT8}
    weight_dqs = [n for n in island.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in int8_weights]
    assert len(weight_dqs) >= 2  # every Conv's and Gemm's weight, as onnxruntime's QDQ fusions need
    optimized = tmp_path / "island_ort.onnx"
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(optimized)
    session = ort.InferenceSession(island.SerializeToString(), options, providers=["CPUExecutionProvider"])
    assert "QLinearConv" in {n.op_type for n in onnx.load(str(optimized)).graph.node}  # its int8 kernels run
    feeds = {"pixel_values": rng.standard_normal((4, 3, 32, 32)).astype(np.float32)}
    np.testing.assert_allclose(PlanSession(out).run(feeds)["logits"], session.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def test_the_whole_model_hands_onnxruntime_residual_sums_as_conv_and_add():
    """conv_sum_form.py: onnxruntime keeps a FusedConv with a residual input in NCHW."""
    w = onnx.numpy_helper.from_array(np.ones((4, 4, 1, 1), np.float32), "w")
    nodes = [helper.make_node("Sin", ["x"], ["z"]),
             helper.make_node("FusedConv", ["x", "w", "", "z"], ["y"], domain="com.microsoft", kernel_shape=[1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 2, 2])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    offered = onnx.load_from_string(tune_whole.whole_model_bytes(model))
    assert [n.op_type for n in offered.graph.node] == ["Sin", "Conv", "Add"]


def _dynamic_quantized_mlp(folder):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal(shape).astype(np.float32) * 0.05 for shape in ((1024, 256), (256, 64)))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1024])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])],
                              [onnx.numpy_helper.from_array(w1, "w1"), onnx.numpy_helper.from_array(w2, "w2")])
    plain = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(plain, folder / "mlp.onnx")
    quantize_dynamic(str(folder / "mlp.onnx"), str(folder / "mlp_q.onnx"), weight_type=QuantType.QInt8)
    return onnx.load(str(folder / "mlp_q.onnx")), plain


def test_a_model_quantized_by_another_tool_is_held_to_its_own_conditioning(tmp_path):
    """onnxruntime's outputs of a quantize_dynamic model move by a step of its grid when the inputs
    move by two ulps (a code flips at a bin edge): the check's tolerance follows that
    (WholeModel.reference_noise, up to AGREE_RTOL_GRID); an fp32 model is not nudged, and a variant
    off by more than that is still refused."""
    from infc.compiler.testing import lowered_and_observed

    quantized, plain = _dynamic_quantized_mlp(tmp_path)
    x = np.random.default_rng(1).standard_normal((128, 1024)).astype(np.float32)
    nudged = tune_whole.nudged_feeds({"x": x, "ids": np.arange(3)})
    assert nudged["ids"] is not None and np.array_equal(nudged["ids"], np.arange(3))
    moved = np.abs(nudged["x"].astype(np.float64) - x) / np.abs(x)
    assert nudged["x"].dtype == x.dtype and moved.max() <= 5e-7 and (nudged["x"] > x).mean() == pytest.approx(0.5, abs=0.05)
    noise = {}
    for name, model in (("quantized", quantized), ("plain", plain)):
        whole = tune_whole.offer(model)
        assert tune_whole.prove(whole, model, {"x": x}) is None
        noise[name] = whole.reference_noise
    assert noise["plain"] == 0.0 and 1e-4 < noise["quantized"] < 5e-2  # a flip or more, far below a wrong kernel
    program, _ = lowered_and_observed(quantized, {"opt": {"x": x}})
    whole = tune_whole.offer(quantized)
    whole.reference, whole.reference_noise = tune_whole.original_outputs(quantized, {"x": x}), 0.01
    summary = tune_context.confirm_in_context(program, {"x": x}, budget_s=0.0, whole_model=whole)
    assert summary["agreement_rtol"] == pytest.approx(tune_context.NOISE_FACTOR * 0.01)
    assert not any(r.startswith(tune_whole.WHOLE) for r in summary["rejected_wrong"])
    whole.reference = {name: value * 1.2 for name, value in whole.reference.items()}  # 20% off: a wrong kernel
    summary = tune_context.confirm_in_context(program, {"x": x}, budget_s=0.0, whole_model=whole)
    assert any(r.startswith(tune_whole.WHOLE) for r in summary["rejected_wrong"])


def _relu_then_scale(num_scales: int) -> onnx.ModelProto:
    """y = relu(x) times 1, `num_scales` times over: the same outputs from more or fewer nodes."""
    nodes = [helper.make_node("Relu", ["x"], ["r0"])]
    for index in range(num_scales):
        nodes.append(helper.make_node("Mul", [f"r{index}", "one"], [f"r{index + 1}"]))
    nodes.append(helper.make_node("Identity", [f"r{num_scales}"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
                              [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_the_model_as_given_races_whole_where_onnxruntime_runs_it_faster(monkeypatch):
    """fp32: onnxruntime's own fusions of the original can beat what it makes of infc's optimized model
    (the BERT fixture: 93 against 170 us); prove() times both once and keeps the faster by a margin."""
    given, optimized = _relu_then_scale(0), _relu_then_scale(3)
    feeds = {"x": np.array([-1.0, 2.0, 3.0], np.float32)}
    for medians, form in (({"optimized": 1.0, "as given": 0.5}, "as given"), ({"optimized": 1.0, "as given": 0.97}, "optimized")):
        monkeypatch.setattr(tune_whole, "time_forms", lambda forms, feeds, medians=medians: dict(medians))
        whole = tune_whole.offer(optimized, as_given=given)
        assert whole.as_given_bytes == tune_whole.whole_model_bytes(given)
        assert tune_whole.prove(whole, given, feeds) is None
        assert whole.form == form and whole.form_ms == medians and whole.as_given_bytes is None
        assert whole.model_bytes == tune_whole.whole_model_bytes(given if form == "as given" else optimized)
        np.testing.assert_array_equal(whole.reference["y"], [0.0, 2.0, 3.0])


def test_the_model_as_given_is_timed_for_real_and_offered_only_at_fp32_with_the_same_io():
    given, optimized = _relu_then_scale(0), _relu_then_scale(2)
    whole = tune_whole.offer(optimized, as_given=given)
    assert tune_whole.prove(whole, given, {"x": np.ones(4, np.float32)}) is None
    assert set(whole.form_ms) == set(tune_whole.FORM_ORDER) and all(ms > 0 for ms in whole.form_ms.values())  # also at 1 thread
    assert whole.model_bytes == tune_whole.whole_model_bytes(given if whole.form == "as given" else optimized)
    assert tune_whole.offer(optimized, is_reduced=True, as_given=given).as_given_bytes is None
    renamed = _relu_then_scale(0)
    renamed.graph.output[0].name = renamed.graph.node[-1].output[0] = "z"
    assert tune_whole.offer(optimized, as_given=renamed).as_given_bytes is None


def test_a_form_at_one_thread_replaces_the_default_only_by_the_margin():
    one = tune_whole.ONE_THREAD
    assert tune_whole.picked_form({"optimized": 1.0, "as given": 0.97, "optimized" + one: 0.5, "as given" + one: 0.49}) == "optimized" + one
    assert tune_whole.picked_form({"optimized": 1.0, "as given": 0.5, "optimized" + one: 0.9, "as given" + one: 0.48}) == "as given"
    assert tune_whole.picked_form({"optimized": 1.0, "optimized" + one: 0.97}) == "optimized"
    assert tune_whole.picked_form({}) == "optimized"


def test_a_whole_model_timed_faster_at_one_thread_runs_at_one_thread_and_matches_onnxruntime(tmp_path, monkeypatch):
    """prove() times each form at one intra-op thread too (AECMOS on a shared two-core machine: 60 ms in
    onnxruntime's default session, 30 ms at one thread); the plan's island then runs at one thread."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])],
                              [onnx.numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    (tmp_path / "m.yaml").write_text("inputs:\n  x: [4, 16]\n")
    def one_thread_faster(forms, feeds):  # (the forms timed for real: the test above)
        return {label: (0.5 if label.endswith(tune_whole.ONE_THREAD) else 1.0) for label in forms}
    monkeypatch.setattr(tune_whole, "time_forms", one_thread_faster)
    monkeypatch.setattr(tune_context, "whole_wins", lambda medians: tune_whole.WHOLE in medians)
    report = build(str(tmp_path / "m.onnx"), str(tmp_path / "m.yaml"), str(tmp_path / "m.plan"),
                   BuildOptions(use_cache=False, show_progress=False, cache_dir=tmp_path))
    assert report["conv_tactics"]["whole_model_threads"] == 1
    session = PlanSession(tmp_path / "m.plan")
    console = Console(record=True, width=200)
    print_plan_report(plan_report(str(tmp_path / "m.plan")), console)
    assert "one onnxruntime session of one intra-op thread" in console.export_text()
    (step,) = session.plan.meta["program"]
    assert step["name"] == tune_whole.WHOLE and step["tactic_threads"] == 1
    x = rng.standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_allclose(session.run({"x": x})["y"], ort_session(model).run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
