"""Graphs whose outputs are not tensors (a ZipMap's sequence of {label: probability} maps, as
scikit-learn converters write by default): the optimizer keeps their types, --verify compares them,
and a build refuses them in one line naming the output (plans hold tensors)."""

import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

from infc.compiler.optimize import optimize_model
from infc.compiler.verify import ort_session, verify_models

MAP_OF_PROBABILITIES = helper.make_sequence_type_proto(
    helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, None)))


def _zipmap_model() -> onnx.ModelProto:
    """x -> ai.onnx.ml Scaler -> Cast(float, a no-op the optimizer drops) -> ZipMap -> seq(map)."""
    nodes = [helper.make_node("Scaler", ["x"], ["scaled"], domain="ai.onnx.ml", offset=[0.5, -1.0, 2.0], scale=[2.0, 1.0, 0.5]),
             helper.make_node("Cast", ["scaled"], ["probability_tensor"], to=TensorProto.FLOAT),
             helper.make_node("ZipMap", ["probability_tensor"], ["probabilities"], domain="ai.onnx.ml", classlabels_int64s=[0, 1, 2])]
    graph = helper.make_graph(nodes, "zipmap", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                              [helper.make_value_info("probabilities", MAP_OF_PROBABILITIES),
                               helper.make_tensor_value_info("scaled", TensorProto.FLOAT, ["n", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def test_the_optimizer_keeps_a_sequence_of_maps_output():
    model = _zipmap_model()
    optimized = optimize_model(model).model
    assert [n.op_type for n in optimized.graph.node] == ["Scaler", "ZipMap"]
    assert optimized.graph.output[0].type == MAP_OF_PROBABILITIES
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    expected, actual = (ort_session(m).run(["probabilities"], {"x": x})[0] for m in (model, optimized))
    assert actual == expected  # a list of dicts, as onnxruntime gives one
    diffs = verify_models(model, optimized, feeds={"x": x})
    assert [d.max_rel_diff for d in diffs] == [0.0, 0.0]


def test_verify_compares_maps_with_a_tolerance():
    from infc.compiler.verify import compare_outputs

    expected = [{0: 1.0, 1: 2.0}, {0: 3.0, 1: 4.0}]
    actual = [{0: 1.0, 1: 2.0}, {0: 3.0, 1: 4.0 + 4e-6}]
    diff = compare_outputs(["p"], [expected], [actual])[0]
    assert 0 < diff.max_rel_diff < 2e-6 and diff.worst_index == (1, 1)


def test_a_build_refuses_a_sequence_of_maps_output_in_one_line(tmp_path):
    onnx.save(_zipmap_model(), tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text("inputs: {x: {min: [1, 3], opt: [4, 3], max: [8, 3]}}\n")
    result = subprocess.run([sys.executable, "-m", "infc.cli", "build", str(tmp_path / "m.onnx"), "--profile",
                             str(tmp_path / "p.yaml"), "-o", str(tmp_path / "m.plan"), "--no-cache"],
                            capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "m.onnx: output 'probabilities' is a " \
        "seq(map(int64,tensor(float))); infc plans take and return tensors only" in lines[0], result.stderr
    assert not (tmp_path / "m.plan").exists()
    # the tensor the ZipMap reads is named, with a way to make it the output (CatBoost always writes a ZipMap)
    assert "ZipMap 'probabilities' makes it from the tensor 'probability_tensor'" in lines[0]
    assert "onnx.utils.extract_model(MODEL, OUT, ['x'], ['probability_tensor', 'scaled'])" in lines[0]


def test_graphsurgeon_warnings_stay_off_stdout(tmp_path):
    """graphsurgeon warns on stdout about the map type; `--json` output must parse all the same."""
    import json

    onnx.save(_zipmap_model(), tmp_path / "m.onnx")
    for args in (["inspect", tmp_path / "m.onnx", "--json"], ["optimize", tmp_path / "m.onnx", "-o", tmp_path / "o.onnx", "--json"]):
        result = subprocess.run([sys.executable, "-m", "infc.cli", *map(str, args)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["nodes_before"] == 3
        assert "Could not convert" in result.stderr
