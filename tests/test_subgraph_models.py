"""Models with control flow (If) whose branches read outer-scope values: the optimizer must not make
a branch return an outer value directly (onnxruntime refuses that), and a plan's onnxruntime island
holding the If must receive the outer values its branches read. The shape follows exported voice
activity detectors (an If on the sample rate around the whole network)."""

import numpy as np
import onnx
from onnx import TensorProto, helper

from infc.compiler.lower import lower_graph
from infc.compiler.graph import import_graph
from infc.compiler.optimize import optimize_model
from infc.compiler.runtime.executor import Executor
from infc.compiler.runtime.kernels import has_kernel
from infc.compiler.testing import assert_matches_ort
from infc.compiler.verify import ort_session


def _branch(name: str, scale: float) -> onnx.GraphProto:
    # reads the outer `x` and `h`; returns an Identity of an outer value next to a computed one
    nodes = [helper.make_node("Mul", ["x", f"{name}_scale"], [f"{name}_y"]),
             helper.make_node("Identity", ["h"], [f"{name}_state"])]
    scale_init = helper.make_tensor(f"{name}_scale", TensorProto.FLOAT, [], [scale])
    outputs = [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None),
               helper.make_tensor_value_info(f"{name}_state", TensorProto.FLOAT, None)]
    return helper.make_graph(nodes, name, [], outputs, [scale_init])


def _model() -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["state"], ["h"]),
             helper.make_node("Equal", ["sr", "sr16k"], ["is16k"]),
             helper.make_node("If", ["is16k"], ["y", "state_out"], then_branch=_branch("then", 2.0),
                              else_branch=_branch("else", 3.0))]
    graph = helper.make_graph(
        nodes, "vad_like",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8]),
         helper.make_tensor_value_info("state_out", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor("sr16k", TensorProto.INT64, [], [16000])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds(sr: int) -> dict:
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((2, 8)).astype(np.float32),
            "state": rng.standard_normal((2, 4)).astype(np.float32), "sr": np.array(sr, dtype=np.int64)}


def test_optimized_branches_never_return_an_outer_value_directly():
    model = _model()
    optimized = optimize_model(model).model
    for sr in (16000, 8000):
        assert_matches_ort(model, optimized, feeds=_feeds(sr))  # onnxruntime loads and runs it


def test_island_holding_an_if_receives_the_outer_values_its_branches_read():
    model = _model()
    program = lower_graph(import_graph(optimize_model(model).model), has_kernel, allow_fallback=True)
    island = next(step for step in program.steps if step["op"] == "__island__")
    assert {"x", "h"} <= set(island["inputs"])
    names = [o["name"] for o in program.outputs]
    executor = Executor(program.steps, program.weights, program.opset, program.islands, output_names=names)
    for sr in (16000, 8000):
        expected = ort_session(model).run(names, _feeds(sr))
        actual = executor.run(_feeds(sr))
        for name, ref in zip(names, expected):
            np.testing.assert_allclose(actual[name], ref, rtol=1e-6)


def test_build_takes_representative_inputs_for_value_dependent_models(tmp_path):
    """The If picks a branch from the sample rate: random int64 values pick a branch whose shapes
    do not fit (as in exported voice-activity detectors); --inputs gives the build real values."""
    import subprocess
    import sys

    model = _model()
    else_branch = next(a.g for a in model.graph.node[2].attribute if a.name == "else_branch")
    else_branch.node[0].CopyFrom(helper.make_node("Gather", ["x", "past_the_end"], ["else_y"], axis=1))  # x has 8 columns
    else_branch.initializer.append(helper.make_tensor("past_the_end", TensorProto.INT64, [8], list(range(100, 108))))
    path = tmp_path / "vad_like.onnx"
    onnx.save(model, path)
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, **_feeds(16000))

    def build(*extra):
        return subprocess.run([sys.executable, "-m", "infc.cli", "build", str(path), "-o", str(tmp_path / "p.plan"),
                               "--no-cache", "--target", "cpu", *extra], capture_output=True, text=True)

    random = build()
    assert random.returncode == 2 and not (tmp_path / "p.plan").exists()
    assert random.stderr.strip().splitlines()[-1].startswith(f"error: {path}: the model does not run on random inputs")
    given = build("--inputs", str(feeds), "--verify", "--json")
    assert given.returncode == 0, given.stderr
    assert '"max_rel_diff": 0.0' in given.stdout.replace("0e+00", "0.0") or '"max_rel_diff": 0' in given.stdout
    # `infc run` on random inputs fails the same way, and says what to pass; on real ones it runs
    run = subprocess.run([sys.executable, "-m", "infc.cli", "run", str(tmp_path / "p.plan"), "--iterations", "1"],
                         capture_output=True, text=True)
    (line,) = run.stderr.strip().splitlines()
    assert run.returncode == 1 and line.startswith("error: ") and line.endswith("needs real ones, --inputs FEEDS.npz)")
    run = subprocess.run([sys.executable, "-m", "infc.cli", "run", str(tmp_path / "p.plan"), "--inputs", str(feeds),
                          "--iterations", "1"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_build_with_inputs_at_other_shapes_than_a_failing_level_says_so(tmp_path):
    """--inputs stand in only at their own shapes; when random inputs at another level fail (as a
    detector's data-dependent Reshape does), the error names the given shapes instead of asking
    for --inputs again."""
    import subprocess
    import sys

    graph = helper.make_graph([helper.make_node("Reshape", ["x", "four"], ["y"])], "fixed_size",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              [helper.make_tensor("four", TensorProto.INT64, [1], [4])])
    path = tmp_path / "fixed_size.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    feeds, profile = tmp_path / "feeds.npz", tmp_path / "shapes.yaml"
    np.savez(feeds, x=np.arange(4, dtype=np.float32))
    profile.write_text("inputs:\n  x: {min: [2], opt: [4], max: [4]}\n")
    result = subprocess.run([sys.executable, "-m", "infc.cli", "build", str(path), "-o", str(tmp_path / "p.plan"),
                             "--no-cache", "--target", "cpu", "--profile", str(profile), "--inputs", str(feeds)],
                            capture_output=True, text=True)
    line = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and not (tmp_path / "p.plan").exists() and line.startswith(f"error: {path}: ")
    assert "at the profile's min shapes" in line and "--inputs stand in only at the profile level whose shapes they have (x [4])" in line
