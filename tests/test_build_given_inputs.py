"""--inputs with a range profile: the given inputs stand in only at the level whose shapes they
have; where random ones then fail (indices a converter's ScatterND/GatherND take from an input),
the error says so instead of asking for the --inputs already given."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from infc.compiler.build import BuildOptions, build
from infc.compiler.errors import BadInput


def _gather_nd_model(path):
    graph = helper.make_graph(
        [helper.make_node("GatherND", ["data", "idx"], ["y"])], "gather_nd",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, ["B", 3]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, ["K", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["K"])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def test_given_inputs_at_another_level_are_named_in_the_error(tmp_path):
    model, profile = tmp_path / "m.onnx", tmp_path / "p.yaml"
    _gather_nd_model(model)
    # min: one row in data, random row indices in {0, 1} step outside it (onnxruntime fails too)
    profile.write_text("inputs:\n  data: {min: [1, 3], opt: [4, 3], max: [4, 3]}\n"
                       "  idx: {min: [8, 2], opt: [8, 2], max: [8, 2]}\n")
    feeds = {"data": np.ones((4, 3), np.float32), "idx": np.zeros((8, 2), np.int64)}
    options = BuildOptions(use_cache=False, show_progress=False, sample_feeds=feeds)
    with pytest.raises(BadInput, match="--inputs stand in only at the profile level whose shapes they have"):
        build(str(model), str(profile), str(tmp_path / "p.plan"), options)
    with pytest.raises(BadInput, match="give representative inputs with --inputs FEEDS.npz"):
        build(str(model), str(profile), str(tmp_path / "p.plan"), BuildOptions(use_cache=False, show_progress=False))
    # at the inputs' own shapes (no range) the build runs on them
    profile.write_text("inputs:\n  data: [4, 3]\n  idx: [8, 2]\n")
    build(str(model), str(profile), str(tmp_path / "p.plan"), options)
    assert (tmp_path / "p.plan").exists()
