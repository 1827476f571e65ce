"""`infc build` / `infc run` / `infc cache` end to end on the fixtures: numerics against
onnxruntime, the engine cache, the timing cache, parallel builds and every bad-input case."""

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from infc.compiler.runtime.session import PlanSession
from infc.compiler.testing import FIXTURES
from infc.compiler.verify import compare_outputs, ort_session

PROFILES = Path(__file__).resolve().parent.parent / "profiles"


def infc(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "infc.cli", *map(str, args)], capture_output=True, text=True, cwd=cwd)


def build(tmp_path, model, profile, out="plan.bin", *extra):
    result = infc("build", model, "--profile", profile, "-o", tmp_path / out, "--cache-dir", tmp_path / "cache", "--json", *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def assert_plan_matches_ort(plan_path, model_path, feeds, rtol=1e-4):
    session = PlanSession(plan_path)
    model = onnx.load(model_path)
    names = [o.name for o in model.graph.output]
    expected = ort_session(model).run(names, feeds)
    actual = session.run(session.check_feeds(feeds, "test"))
    for diff in compare_outputs(names, expected, [actual[n] for n in names]):
        assert diff.max_rel_diff <= rtol, diff


def one_line_error(result, code, *fragments):
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def cnn_plan(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cnn")
    report = build(tmp, FIXTURES / "cnn_ts.onnx", PROFILES / "cnn.yaml")
    return tmp, report


def test_cnn_plan_matches_onnxruntime(cnn_plan):
    tmp, report = cnn_plan
    assert report["cache_hit"] is False and report["plan"].endswith("plan.bin")
    for batch in (1, 4, 8):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 32, 32)).astype(np.float32)
        assert_plan_matches_ort(tmp / "plan.bin", FIXTURES / "cnn_ts.onnx", {"pixel_values": x})


def test_second_build_is_a_cache_hit_and_a_changed_profile_says_why(cnn_plan, tmp_path):
    tmp, _ = cnn_plan
    again = build(tmp, FIXTURES / "cnn_ts.onnx", PROFILES / "cnn.yaml", "again.bin")
    assert again["cache_hit"] is True and again["build_s"] < 1.0
    assert (tmp / "again.bin").read_bytes() == (tmp / "plan.bin").read_bytes()
    other = tmp_path / "other.yaml"
    other.write_text("inputs:\n  pixel_values: [2, 3, 32, 32]\n")
    changed = build(tmp, FIXTURES / "cnn_ts.onnx", other, "other.bin")
    assert changed["cache_hit"] is False and "profile" in changed["cache_reason"]


def test_run_json_and_outputs(cnn_plan, tmp_path):
    tmp, _ = cnn_plan
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "in.npz", pixel_values=x)
    result = infc("run", tmp / "plan.bin", "--inputs", tmp_path / "in.npz", "--outputs", tmp_path / "out.npz",
                  "--iterations", 3, "--warmup", 0, "--json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    latency = stats["latency_ms"]
    assert stats["warmup"] == 0
    assert set(latency) >= {"p50", "p90", "p99", "mean", "min", "max", "std"} and latency["iterations"] == 3
    assert latency["min"] <= latency["p50"] <= latency["max"]
    assert stats["throughput_per_s"] == pytest.approx(1e3 / latency["mean"], rel=1e-6)
    expected = ort_session(onnx.load(FIXTURES / "cnn_ts.onnx")).run(None, {"pixel_values": x})[0]
    got = np.load(tmp_path / "out.npz")["logits"]
    assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()


def test_run_op_profile_times_every_step_and_the_shares_add_up(cnn_plan):
    tmp, _ = cnn_plan
    result = infc("run", tmp / "plan.bin", "--iterations", 4, "--op-profile", "--json")
    assert result.returncode == 0, result.stderr
    profile = json.loads(result.stdout)["op_profile"]
    assert profile["runs"] == 4 and profile["steps"] and profile["ops"]
    assert [row["ms"] for row in profile["steps"]] == sorted((row["ms"] for row in profile["steps"]), reverse=True)
    assert sum(row["share_pct"] for row in profile["steps"]) == pytest.approx(100.0)
    assert sum(entry["ms"] for entry in profile["ops"]) == pytest.approx(profile["steps_ms"])
    assert all(row["calls"] >= 1 and row["step"] and row["op"] for row in profile["steps"])
    text = infc("run", tmp / "plan.bin", "--iterations", 2, "--op-profile")
    assert text.returncode == 0 and "op type (steps)" in text.stdout and "time per run over 2 more runs" in text.stdout


def test_shape_outside_profile_warns_once_and_is_right(cnn_plan, tmp_path):
    tmp, _ = cnn_plan
    x = np.random.default_rng(1).standard_normal((12, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "in.npz", pixel_values=x)
    result = infc("run", tmp / "plan.bin", "--inputs", tmp_path / "in.npz", "--iterations", 2)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("outside the profile") == 1
    assert_plan_matches_ort(tmp / "plan.bin", FIXTURES / "cnn_ts.onnx", {"pixel_values": x})


def test_timing_cache_is_reused_by_another_model(tmp_path):
    first = build(tmp_path, FIXTURES / "bert_ts.onnx", PROFILES / "bert.yaml", "bert_ts.bin")
    assert first["timing_cache"]["misses"] > 0
    second = build(tmp_path, FIXTURES / "bert_dynamo.onnx", PROFILES / "bert.yaml", "bert_dynamo.bin")
    assert second["timing_cache"]["misses"] == 0 and second["timing_cache"]["hits"] > 0
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 100, (2, 16)).astype(np.int64), "attention_mask": np.ones((2, 16), np.int64)}
    feeds["attention_mask"][1, 10:] = 0
    for name in ("bert_ts", "bert_dynamo"):
        assert_plan_matches_ort(tmp_path / f"{name}.bin", FIXTURES / f"{name}.onnx", feeds)


def test_parallel_builds_of_one_key_leave_one_valid_plan(tmp_path):
    command = [sys.executable, "-m", "infc.cli", "build", FIXTURES / "cnn_ts.onnx", "--profile", PROFILES / "cnn.yaml",
               "--cache-dir", tmp_path / "cache", "--json"]
    procs = [subprocess.Popen([*map(str, command), "-o", str(tmp_path / f"p{i}.bin")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for i in range(4)]
    assert all(p.wait() == 0 for p in procs)
    plans = list((tmp_path / "cache" / "engines").glob("*.plan"))
    assert len(plans) == 1
    PlanSession(plans[0])
    assert not [p for p in (tmp_path / "cache" / "engines").iterdir() if p.name.startswith(".")]


def test_cache_ls_and_clear(cnn_plan):
    tmp, _ = cnn_plan
    listed = infc("cache", "ls", "--cache-dir", tmp / "cache", "--json")
    assert listed.returncode == 0 and any(e["model_name"] == "cnn_ts.onnx" for e in json.loads(listed.stdout))


def test_inspect_plan(cnn_plan):
    tmp, _ = cnn_plan
    result = infc("inspect", tmp / "plan.bin", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["target"]["kind"] == "cpu" and report["memory"]["arena_bytes"] <= report["memory"]["sum_activation_bytes"]


# --- bad input -------------------------------------------------------------------------------------

def test_malformed_and_mismatched_profiles(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("inputs: {pixel_values: {min: [1, 3, 32, 32], max: [2, 3, 32, 32]}}\n")
    out = tmp_path / "p.bin"
    one_line_error(infc("build", FIXTURES / "cnn_ts.onnx", "--profile", bad, "-o", out, "--no-cache"), 2, "bad.yaml", "min, opt and max")
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("inputs: {images: [1, 3, 32, 32]}\n")
    one_line_error(infc("build", FIXTURES / "cnn_ts.onnx", "--profile", wrong, "-o", out, "--no-cache"), 2, "images")
    assert not out.exists()


def _plan_copy(cnn_plan, tmp_path):
    data = bytearray((cnn_plan[0] / "plan.bin").read_bytes())
    return data, tmp_path / "bad.bin"


def test_truncated_flipped_and_newer_plans(cnn_plan, tmp_path):
    data, path = _plan_copy(cnn_plan, tmp_path)
    path.write_bytes(data[: len(data) // 2])
    one_line_error(infc("run", path, "--iterations", 1), 2, "bad.bin")
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x40
    path.write_bytes(flipped)
    one_line_error(infc("run", path, "--iterations", 1), 2, "bad.bin", "sha256")
    newer = bytearray(data)
    newer[8:12] = struct.pack("<I", 99)
    path.write_bytes(newer)
    one_line_error(infc("run", path, "--iterations", 1), 2, "newer")


def test_plan_for_another_target_exits_3_naming_fields(cnn_plan, tmp_path):
    from infc.compiler.plan.format import read_plan, write_plan

    plan = read_plan(cnn_plan[0] / "plan.bin")
    meta = dict(plan.meta, target=dict(plan.meta["target"], cpu="Imaginary CPU 9000", isa=["avx512f"]))
    path = tmp_path / "other.bin"
    write_plan(path, meta, {name: bytes(view) for name, view in plan.sections.items()})
    one_line_error(infc("run", path, "--iterations", 1), 3, "cpu", "isa", "infc build")


def test_bad_inputs_files(cnn_plan, tmp_path):
    plan = cnn_plan[0] / "plan.bin"
    cases = {
        "names": {"images": np.zeros((1, 3, 32, 32), np.float32)},
        "dtype": {"pixel_values": np.zeros((1, 3, 32, 32), np.float64)},
        "shape": {"pixel_values": np.zeros((1, 3, 16, 32), np.float32)},
    }
    for case, arrays in cases.items():
        path = tmp_path / f"{case}.npz"
        np.savez(path, **arrays)
        one_line_error(infc("run", plan, "--inputs", path, "--outputs", tmp_path / "o.npz"), 2, f"{case}.npz")
    assert not (tmp_path / "o.npz").exists()
    (tmp_path / "junk.npz").write_text("junk")
    one_line_error(infc("run", plan, "--inputs", tmp_path / "junk.npz"), 2, "junk.npz")


@pytest.mark.parametrize("training, ratio, refused", [(True, 0.1, True), (False, 0.1, False), (True, 0.0, False)])
def test_a_model_exported_in_training_mode_is_refused_before_building(tmp_path, training, ratio, refused):
    """Dropout with a constant true training_mode drops random elements (a dynamo export of a module
    left in train mode): the build says so in one line, exit 2, no plan; in eval form it builds."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Dropout", ["r", "ratio", "training"], ["y"], name="drop")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [numpy_helper.from_array(np.array(ratio, np.float32), "ratio"), numpy_helper.from_array(np.array(training), "training")])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), model)
    profile = tmp_path / "p.yaml"
    profile.write_text("inputs: {x: [2, 8]}\n")
    out = tmp_path / "p.bin"
    result = infc("build", model, "--profile", profile, "-o", out, "--no-cache")
    if refused:
        one_line_error(result, 2, "m.onnx", "Dropout 'drop' runs in training mode", "eval mode")
        assert not out.exists()
    else:
        assert result.returncode == 0, result.stderr


def test_feeding_an_input_the_model_gives_a_default_says_it_is_built_in(tmp_path):
    """An initializer the model also lists as an input (a default onnxruntime lets callers
    override): infc builds it in as a constant, and a feed of it says so instead of 'unknown'."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "scale"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3]), helper.make_tensor_value_info("scale", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
        [numpy_helper.from_array(np.array([1.0, 2.0, 3.0], np.float32), "scale")])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), model)
    (tmp_path / "p.yaml").write_text("inputs: {x: {min: [1, 3], opt: [2, 3], max: [4, 3]}}\n")
    assert infc("build", model, "--profile", tmp_path / "p.yaml", "-o", tmp_path / "p.bin", "--no-cache").returncode == 0
    x = np.ones((2, 3), np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    assert_plan_matches_ort(tmp_path / "p.bin", model, {"x": x})
    np.savez(tmp_path / "both.npz", x=x, scale=np.full(3, 9.0, np.float32))
    one_line_error(infc("run", tmp_path / "p.bin", "--inputs", tmp_path / "both.npz"), 2, "both.npz",
                   "input 'scale' has a default value in the model", "builds in as a constant")
    one_line_error(infc("build", model, "--inputs", tmp_path / "both.npz", "-o", tmp_path / "q.bin", "--no-cache"), 2,
                   "input 'scale' has a default value in the model")
    (tmp_path / "listed.yaml").write_text("inputs: {x: [2, 3], scale: [3]}\n")
    one_line_error(infc("build", model, "--profile", tmp_path / "listed.yaml", "-o", tmp_path / "q.bin", "--no-cache"), 2,
                   "inputs.scale: the model gives 'scale' a default value", "leave it out of the profile")


def test_inputs_at_sizes_the_model_cannot_run_are_bad_input(tmp_path):
    """A map added to an upsampled copy of its pooled half (HRNet, DLA) agrees in size only for
    some heights: onnxruntime fails at the others too, so infc says which input shapes, exit 2."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("AveragePool", ["a"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Resize", ["p", "", "scales"], ["u"], mode="nearest"),
             helper.make_node("Add", ["a", "u"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, "ho", "wo"])],
        [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
         numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), model)
    profile = tmp_path / "p.yaml"
    profile.write_text("inputs:\n  x: {min: [1, 3, 16, 16], opt: [1, 3, 32, 32], max: [2, 3, 32, 32]}\n")
    build(tmp_path, model, profile)
    fits = {"x": rng.standard_normal((1, 3, 24, 24)).astype(np.float32)}
    assert_plan_matches_ort(tmp_path / "plan.bin", model, fits)
    odd = {"x": rng.standard_normal((1, 3, 18, 18)).astype(np.float32)}
    with pytest.raises(Exception, match="broadcast"):
        ort_session(onnx.load(model)).run(None, odd)
    np.savez(tmp_path / "odd.npz", **odd)
    result = infc("run", tmp_path / "plan.bin", "--inputs", tmp_path / "odd.npz", "--outputs", tmp_path / "o.npz")
    one_line_error(result, 2, "odd.npz", "does not run at input shapes x [1, 3, 18, 18]", "broadcast")
    assert not (tmp_path / "o.npz").exists()


def test_a_gemm_reading_a_graph_input_is_tuned(tmp_path):
    """The sample runs record what steps produce; a model's first MatMul takes its rows from the profile."""
    from onnx import helper

    from infc.compiler.testing import make_model

    weight = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                       [("x", np.float32, ["batch", 64])], [("y", np.float32, ["batch", 48])], {"w": weight})
    onnx.save(model, tmp_path / "gemm.onnx")
    (tmp_path / "p.yaml").write_text("inputs:\n  x: {min: [1, 64], opt: [16, 64], max: [64, 64]}\n")
    report = build(tmp_path, tmp_path / "gemm.onnx", tmp_path / "p.yaml")
    assert report["timing_cache"]["misses"] >= 2  # buckets 1 .. 64
    feeds = {"x": np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)}
    assert_plan_matches_ort(tmp_path / "plan.bin", tmp_path / "gemm.onnx", feeds)


def test_model_whose_island_onnxruntime_refuses_is_bad_input(tmp_path):
    # quantize_static (QOperator) of a ViT wrote a QLinearAdd reading an int32 bias (a shared initializer):
    # infc has no QLinearAdd kernel, so it is an onnxruntime island, and its session refused to load (exit 1)
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("QLinearAdd", ["xq", "s", "z", "bad", "s", "z", "s", "z"], ["yq"], domain="com.microsoft"),
             helper.make_node("DequantizeLinear", ["yq", "s", "z"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0.1, np.float32), "s"), numpy_helper.from_array(np.array(128, np.uint8), "z"),
             numpy_helper.from_array(np.arange(4, dtype=np.int32), "bad")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=8)
    path = tmp_path / "refused.onnx"
    onnx.save(model, path)
    result = infc("build", path, "-o", tmp_path / "p.bin", "--no-cache")
    assert result.returncode == 2, result.stderr
    (line,) = [x for x in result.stderr.strip().splitlines() if x.startswith("error:")]
    assert line.startswith(f"error: {path}: the ops infc has no kernel for run in onnxruntime, which refuses the model")
    assert "Traceback" not in result.stderr and not (tmp_path / "p.bin").exists()


def test_verify_of_a_model_onnxruntime_refuses_names_the_model_and_builds_without_it(tmp_path):
    """torch's dynamo export of istft writes ScatterND with int32 indices, which onnxruntime refuses to
    load and infc runs: --verify has no reference (one line naming the model, no plan written); the
    plan builds without it and computes what the graph says."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("ScatterND", ["x", "indices", "updates"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4]),
                     helper.make_tensor_value_info("updates", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(np.array([[0], [2]], np.int32), "indices")])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), model)
    profile = tmp_path / "p.yaml"
    profile.write_text("inputs:\n  x: {min: [3, 4], opt: [4, 4], max: [8, 4]}\n  updates: [2, 4]\n")
    result = infc("build", model, "--profile", profile, "-o", tmp_path / "plan.bin", "--no-cache", "--verify", "--json")
    one_line_error(result, 2, str(model), "--verify", "onnxruntime cannot load the model", "builds without --verify")
    assert not (tmp_path / "plan.bin").exists()
    build(tmp_path, model, profile)
    x, updates = np.zeros((5, 4), np.float32), np.ones((2, 4), np.float32)
    y = PlanSession(tmp_path / "plan.bin").run({"x": x, "updates": updates})["y"]
    np.testing.assert_array_equal(y, np.array([[1] * 4, [0] * 4, [1] * 4, [0] * 4, [0] * 4], np.float32))


def test_verify_names_an_onnxruntime_run_failure_as_the_reference_not_the_plan(tmp_path):
    """onnxruntime loads the model but fails running it: --verify has no reference, which is bad input
    saying so (it was an internal error, exit 1); the relabelling is only for onnxruntime's failures."""
    from infc.compiler.build import _reference_outputs
    from infc.compiler.errors import BadInput
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    ok = _reference_outputs(tmp_path / "m.onnx", model, ["y"], {"x": np.array([-1, 2], np.float32)}, False)
    assert ok[0].tolist() == [0, 2]
    with pytest.raises(BadInput) as failed:  # a feed onnxruntime refuses at run time
        _reference_outputs(tmp_path / "m.onnx", model, ["y"], {"x": np.array([-1, 2], np.int64)}, False)
    message = str(failed.value)
    assert message.startswith(f"{tmp_path / 'm.onnx'}: --verify: onnxruntime cannot run the model (")
    assert message.endswith("the plan builds without --verify") and "\n" not in message
