"""`infc build --precision fp16|bf16|int8|w8`: the plan runs the reduced-precision graph on the CPU
runtime, stays within 1e-2 of the fp32 model in onnxruntime, the overflow fixture is repaired at
build, int8 computes from dequantized weights, w8 decoder plans store int8 weights and keep the
greedy tokens; `infc inspect` reports all of it."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from infc.compiler import ocr
from infc.compiler.build import BuildOptions, build
from infc.compiler.build_precision import PrecisionSettings
from infc.compiler.plan.format import read_plan
from infc.compiler.plan_report import plan_report
from infc.compiler.quantize.greedy_agreement import agreement, runner_greedy_tokens, seeded_prompts
from infc.compiler.runtime.feeds_io import random_plan_feeds
from infc.compiler.runtime.model_runner import load_model_runner
from infc.compiler.runtime.session import PlanSession
from infc.compiler.testing import FIXTURES
from infc.compiler.verify import compare_outputs, ort_session

PROFILES = Path(__file__).resolve().parent.parent / "profiles"
TOLERANCE = 1e-2


def _build(tmp_path, model, profile, precision, name=None, **settings):
    out = tmp_path / f"{name or model.stem}_{precision}.bin"
    report = build(str(model), str(profile) if profile else None, str(out),
                   BuildOptions(precision=precision, use_cache=False, show_progress=False,
                                precision_settings=PrecisionSettings(**settings)))
    return out, report


def _plan_error(plan, model_path, seed=11):
    """Max relative error of the plan against the fp32 model in onnxruntime on fresh inputs."""
    session = PlanSession(plan)
    feeds = random_plan_feeds(session, seed)
    names = [o["name"] for o in session.plan.meta["outputs"]]
    actual = session.run(session.check_feeds(feeds, "test"))
    expected = ort_session(onnx.load(model_path)).run(names, feeds)
    return max(d.max_rel_diff for d in compare_outputs(names, expected, [actual[n] for n in names]))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("name,profile", [("cnn_ts", "cnn"), ("gpt2_ts", "gpt2")])
def test_low_precision_plan_runs_within_tolerance(tmp_path, name, profile, precision):
    model = FIXTURES / f"{name}.onnx"
    plan, report = _build(tmp_path, model, PROFILES / f"{profile}.yaml", precision)
    error = _plan_error(plan, model)
    # within budget, and not the fp32 plan in disguise: reduced-precision rounding is visible
    assert 1e-6 < error <= TOLERANCE, error
    meta = read_plan(plan).meta
    low_type = {"fp16": onnx.TensorProto.FLOAT16, "bf16": onnx.TensorProto.BFLOAT16}[precision]
    assert any(s["op"] == "Cast" and s["attrs"].get("to") == low_type for s in meta["program"])
    stored = meta["precision"]
    assert stored == report["precision"] and stored["repair"]["is_within_tolerance"]
    assert all(o["q_rel"] <= TOLERANCE and o["max_rel"] <= TOLERANCE for o in stored["accuracy"]["outputs"])
    assert stored["accuracy"]["within_tolerance"]


def test_a_plan_over_its_budget_says_so(tmp_path):
    """A budget no bf16 plan can meet: the repair gives up, and the build warns that the plan's own
    error exceeds it instead of reporting only the repair's success or failure."""
    lines = []
    out = tmp_path / "cnn_bf16.bin"
    report = build(str(FIXTURES / "cnn_ts.onnx"), str(PROFILES / "cnn.yaml"), str(out),
                   BuildOptions(precision="bf16", use_cache=False, show_progress=False,
                                precision_settings=PrecisionSettings(tolerance=1e-9)), log=lines.append)
    accuracy = report["precision"]["accuracy"]
    assert accuracy["within_tolerance"] is False
    assert any(line.startswith("warning: the bf16 plan's q_rel error") for line in lines), lines


def test_overflow_fixture_is_repaired_at_build(tmp_path):
    model = FIXTURES / "overflow_fp16.onnx"
    plan, report = _build(tmp_path, model, None, "fp16")
    repair = report["precision"]["repair"]
    assert repair["pinned"] == [["wide_matmul", "MatMul"]]
    assert not repair["error_before"] <= TOLERANCE and repair["error_after"] <= TOLERANCE
    assert _plan_error(plan, model) <= TOLERANCE
    # without the pin the same graph overflows on the CPU runtime too: the repair was needed there
    plan_unrepaired, _ = _build(tmp_path, model, None, "fp16", name="loose", tolerance=float("inf"))
    assert not _plan_error(plan_unrepaired, model) <= TOLERANCE


def test_int8_plan_computes_from_dequantized_weights(tmp_path):
    model = FIXTURES / "cnn_ts.onnx"
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", pixel_values=rng.standard_normal((16, 4, 3, 32, 32)).astype(np.float32))
    plan, report = _build(tmp_path, model, PROFILES / "cnn.yaml", "int8", calib=str(tmp_path / "calib.npz"))
    meta = read_plan(plan).meta
    assert "computes in fp32 from dequantized weights" in meta["precision"]["compute"]
    assert meta["precision"]["folded_constants"]["DequantizeLinear"] > 0
    assert any(s["op"] == "QuantizeLinear" for s in meta["program"])  # activations are fake-quantized
    (logits,) = meta["precision"]["accuracy"]["outputs"]
    assert logits["top1_agreement"] >= 0.75 and 0 < logits["max_rel"] <= 0.2
    assert _plan_error(plan, model) <= 0.2


def test_int8_on_a_float16_model_warns_that_nothing_was_quantized(tmp_path):
    """No silent no-op: the build log and the plan's precision entry say why it still computes in float."""
    from onnx import helper

    from infc.compiler.testing import make_model

    w = np.random.default_rng(1).standard_normal((8, 4)).astype(np.float16)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", np.float16, [2, 8])],
                       [("y", np.float16, [2, 4])], {"w": w})
    path = tmp_path / "half.onnx"
    onnx.save(model, path)
    np.savez(tmp_path / "calib.npz", x=np.ones((2, 8), np.float16))
    lines = []
    build(str(path), None, str(tmp_path / "half.plan"), BuildOptions(
        precision="int8", use_cache=False, show_progress=False,
        precision_settings=PrecisionSettings(calib=str(tmp_path / "calib.npz"))), lines.append)
    assert any(line.startswith("warning: precision int8: nothing quantized") for line in lines), lines
    assert "nothing quantized" in read_plan(tmp_path / "half.plan").meta["precision"]["int8"]["notes"][0]


def test_cli_build_precision_json_and_inspect(tmp_path):
    def infc(*args):
        return subprocess.run([sys.executable, "-m", "infc.cli", *map(str, args)], capture_output=True, text=True)

    plan = tmp_path / "p.bin"
    built = infc("build", FIXTURES / "cnn_ts.onnx", "--profile", PROFILES / "cnn.yaml", "-o", plan, "--precision", "fp16",
                 "--tolerance", "0.005", "--no-cache", "--json")
    assert built.returncode == 0, built.stderr
    assert json.loads(built.stdout)["precision"]["repair"]["tolerance"] == 0.005
    shown = infc("inspect", plan)
    assert "precision fp16" in shown.stdout and "accuracy logits" in shown.stdout and "top-1 agreement" in shown.stdout
    assert plan_report(plan)["precision"]["accuracy"]["outputs"][0]["name"] == "logits"
    refused = infc("build", FIXTURES / "cnn_ts.onnx", "-o", tmp_path / "q.bin", "--precision", "w8", "--no-cache",
                   "--target", "cpu")
    assert refused.returncode == 2 and refused.stderr.splitlines()[-1].startswith("error: --precision w8") and not (tmp_path / "q.bin").exists()
    no_calib = infc("build", FIXTURES / "cnn_ts.onnx", "-o", tmp_path / "q.bin", "--precision", "int8", "--no-cache",
                   "--target", "cpu")
    assert no_calib.returncode == 2 and "--calib" in no_calib.stderr


def test_precision_settings_are_part_of_the_cache_key(monkeypatch):
    monkeypatch.setenv("INFC_WHOLE_MODEL", "1")  # the suite's setting (tests/conftest.py) adds a key of its own

    def key(precision, **settings):
        return BuildOptions(precision=precision, precision_settings=PrecisionSettings(**settings)).key_options()

    assert key("fp32") == {"target": "cpu", "precision": "fp32", "allow_fallback": True}  # fp32 keys unchanged
    assert key("fp16") != key("fp16", tolerance=1e-3) != key("bf16", tolerance=1e-3)
    # --int8-weights: the limit it resolves to on this CPU (auto is one of the two)
    assert key("int8", int8_weights="8bit") != key("int8", int8_weights="7bit")
    assert key("int8") in (key("int8", int8_weights="8bit"), key("int8", int8_weights="7bit"))


def test_cli_int8_weight_choices_are_the_quantizers():
    from infc import cli
    from infc.compiler.quantize.weight_range import CHOICES

    assert cli.INT8_WEIGHTS == list(CHOICES)  # spelled out in cli.py, which starts without the quantize stack


def test_int8_weight_range_is_the_users_choice(tmp_path):
    model = FIXTURES / "cnn_ts.onnx"
    np.savez(tmp_path / "calib.npz", pixel_values=np.random.default_rng(0).standard_normal((4, 2, 3, 32, 32)).astype(np.float32))
    for choice, suffix in (("8bit", ""), ("7bit", " in [-64, 64]")):
        plan, _ = _build(tmp_path, model, PROFILES / "cnn.yaml", "int8", name=choice, calib=str(tmp_path / "calib.npz"),
                         int8_weights=choice)
        assert read_plan(plan).meta["precision"]["int8"]["weight_type"] == "int8 symmetric per-channel" + suffix


@pytest.mark.parametrize("name", ["llama_ts", "gpt2_ts"])
def test_w8_decoder_plan_stores_int8_and_keeps_greedy_tokens(tmp_path, name):
    profile = PROFILES / f"{name.split('_')[0]}_decode.yaml"
    fp32_plan, _ = _build(tmp_path, FIXTURES / f"{name}.onnx", profile, "fp32")
    w8_plan, report = _build(tmp_path, FIXTURES / f"{name}.onnx", profile, "w8")
    meta = read_plan(w8_plan).meta
    w8 = meta["precision"]["w8"]
    # int8 values plus one fp32 scale and one int8 zero point per 16 weights: 21/64 of the fp32 bytes
    assert w8["num_weights"] > 0 and w8["bytes_int8"] <= 0.33 * w8["bytes_fp32"]
    assert sum(1 for name, w in meta["weights"].items() if w["dtype"] == "int8" and name.endswith("/w8")) == w8["num_weights"]
    assert fp32_plan.stat().st_size - w8_plan.stat().st_size >= 0.65 * w8["bytes_fp32"]
    assert meta["precision"]["accuracy"]["greedy"]["agreement"] >= 0.9
    # independently, through the plans as `infc run` loads them, on other prompts
    runners = [load_model_runner(p) for p in (fp32_plan, w8_plan)]
    decoder = meta["decoder"]
    prompts = seeded_prompts(decoder["vocab_size"], 16, 9)  # the acceptance's 16 requests x 32 tokens
    tokens = [runner_greedy_tokens(runner, prompts, 32) for runner in runners]
    assert agreement(*tokens)["agreement"] >= 0.9


@pytest.mark.slow
def test_paddleocr_rec_fp16_plan_decodes_the_line(tmp_path):
    path = ocr.paddleocr_model_paths()["rec"]
    line = ocr.rec_input(ocr.render_text_line("infc 2026 optimizer"))
    np.savez(tmp_path / "line.npz", x=line)
    plan, report = _build(tmp_path, path, PROFILES / "ppocr_rec.yaml", "fp16", calib=str(tmp_path / "line.npz"))
    (probs,) = PlanSession(plan).run({"x": line}).values()
    assert ocr.ctc_greedy_decode(probs[0], ocr.character_list(onnx.load(path))) == "infc 2026 optimizer"
    assert report["precision"]["accuracy"]["outputs"][0]["top1_agreement"] == 1.0


def _two_matmuls(path):
    """x [M, 64] -> MatMul -> Relu -> MatMul -> y [M, 48], seeded random weights."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    weights = [numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name)
               for name, shape in (("w1", (64, 96)), ("w2", (96, 48)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "two_matmuls", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", 48])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_bf16_plan_gemms_race_the_bf16_kernels_and_match_onnxruntime(tmp_path):
    from infc.compiler.runtime import bf16_gemm

    model = _two_matmuls(tmp_path / "two_matmuls.onnx")
    profile = tmp_path / "p.yaml"
    profile.write_text("inputs:\n  x: {min: [3, 64], opt: [40, 64], max: [70, 64]}\n")
    plan, report = _build(tmp_path, model, profile, "bf16")
    # both GEMMs read bf16 values (a Cast pair before each): tuned under bf16 keys, where the bf16
    # kernels compete (run where the CPU has them, pruned with the reason where it has not)
    rows = [row for row in report["tuning"] if row["shape"].startswith("M<=")]
    assert rows and all("bfloat16" in row["key"] for row in rows)
    for row in rows:
        statuses = {c["config"]: c["status"] for c in row["candidates"]}
        assert {"matmul_bf16(kernel=amx)", "matmul_bf16(kernel=avx512)"} <= set(statuses)
    meta = read_plan(plan).meta
    assert meta["precision"]["accuracy"]["within_tolerance"]
    # the first GEMM's output is only read rounded to bf16: it rounds it itself (kernels/tuned_gemm.py)
    tuned = [s for s in meta["program"] if s["op"] == "TunedMatMul"]
    assert len(tuned) == 2 and tuned[0]["attrs"].get("round_to") == onnx.TensorProto.BFLOAT16
    session = PlanSession(plan)
    names = [o["name"] for o in meta["outputs"]]
    for m in (3, 40, 70):  # the profile's min, opt and max rows
        feeds = {"x": np.random.default_rng(m).standard_normal((m, 64)).astype(np.float32)}
        expected = ort_session(onnx.load(model)).run(names, feeds)
        native = session.run(feeds)
        with bf16_gemm.disabled():  # a CPU without AVX512-BF16 / AMX: the plan still runs, in float32
            fallback = PlanSession(plan).run(feeds)
        for outputs in (native, fallback):
            error = max(d.max_rel_diff for d in compare_outputs(names, expected, [outputs[n] for n in names]))
            assert 1e-6 < error <= TOLERANCE, (m, error)


def _two_convs(path):
    """x [N, 32, 24, 24] -> Conv 3x3 (48) -> Relu -> Conv 1x1 (64) -> y, seeded random weights."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    weights = [numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32), name)
               for name, shape in (("w1", (48, 32, 3, 3)), ("b1", (48,)), ("w2", (64, 48, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "two_convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 32, 24, 24])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64, 24, 24])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_bf16_plan_convolutions_race_the_amx_tiles_and_match_onnxruntime(tmp_path, monkeypatch):
    from infc.compiler.runtime import amx_gemm, bf16_gemm
    from infc.compiler.runtime.kernels import amx_conv

    monkeypatch.setenv("INFC_WHOLE_MODEL", "0")  # the program's own kernels, not one onnxruntime session
    model = _two_convs(tmp_path / "two_convs.onnx")
    profile = tmp_path / "p.yaml"
    profile.write_text("inputs:\n  x: {min: [1, 32, 24, 24], opt: [2, 32, 24, 24], max: [2, 32, 24, 24]}\n")
    plan, report = _build(tmp_path, model, profile, "bf16")
    # both convolutions read bf16 values: keyed bfloat16, and infc's kernel on AMX tiles competes
    # where the CPU has AMX-BF16
    rows = [row for row in report["tuning"] if row["shape"].startswith("Conv")]
    assert rows and all("bfloat16" in row["key"] for row in rows)
    has_tiles = amx_gemm.has_amx_bf16()
    for row in rows:
        assert ("infc(tiles=amx-bf16)" in {c["config"] for c in row["candidates"]}) == has_tiles
    meta = read_plan(plan).meta
    convs = [s for s in meta["program"] if s["op"] in ("Conv", "FusedConv")]
    assert len(convs) == 2
    marked = [s for s in convs if s.get("bf16_tiles")]
    assert has_tiles or not marked  # marked only where the tiles were timed (and won)
    session = PlanSession(plan)
    names = [o["name"] for o in meta["outputs"]]
    for n in (1, 2):
        feeds = {"x": np.random.default_rng(n).standard_normal((n, 32, 24, 24)).astype(np.float32)}
        expected = ort_session(onnx.load(model)).run(names, feeds)
        native = session.run(feeds)
        with bf16_gemm.disabled():  # no AMX here: the marked steps run their float32 kernels
            fallback = PlanSession(plan).run(feeds)
        for outputs in (native, fallback):
            error = max(d.max_rel_diff for d in compare_outputs(names, expected, [outputs[n] for n in names]))
            assert 1e-6 < error <= TOLERANCE, (n, error)
    if any(not s.get("tactic") for s in marked):  # the mark reaches infc's kernel: the tiles' packed weight is in its memo
        tiled = [s for s in PlanSession(plan).executor._steps if any(
            isinstance(key, tuple) and key[0] == "amx-conv-weight" for key in s.ctx.memo)]
        assert not tiled  # nothing ran yet
        again = PlanSession(plan)
        again.run({"x": np.ones((1, 32, 24, 24), np.float32)})
        assert any(isinstance(key, tuple) and key[0] == "amx-conv-weight" for s in again.executor._steps for key in s.ctx.memo)
    assert amx_conv.applies((1, 32, 24, 24), (48, 32, 3, 3), 1)


def test_a_reduced_precision_plan_slower_than_fp32_onnxruntime_says_so(tmp_path):
    """The build times onnxruntime on the fp32 model as given, on the race's inputs, and the report
    says when the reduced-precision program is slower (a bf16 ResNet-50 on a Sapphire Rapids core)."""
    from infc.compiler.precision_payoff import fp32_payoff, payoff_note

    model = onnx.load(_two_convs(tmp_path / "two_convs.onnx"))
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 32, 24, 24)).astype(np.float32)}
    slow = fp32_payoff(model, feeds, {"conv_tactics": {"kept": "none", "program_ms": {"none": 1e4}}})
    assert slow["plan_ms"] == 1e4 and 0 < slow["fp32_onnxruntime_ms"] < 1e4 and slow["ratio"] > 1
    note = payoff_note(slow, "bf16")
    assert note and "bf16 does not pay" in note and f"{slow['ratio']:.2f}x" in note
    fast = fp32_payoff(model, feeds, {"conv_tactics": {"kept": "none", "program_ms": {"none": 1e-6}}})
    assert payoff_note(fast, "bf16") is None
    assert fp32_payoff(model, feeds, {}) is None  # no program time measured: nothing to compare
    assert fp32_payoff(model, {"x": np.zeros((1, 5), np.float32)}, {"conv_tactics": {"kept": "none", "program_ms": {"none": 1.0}}}) is None
