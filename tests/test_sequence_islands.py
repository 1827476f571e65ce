"""Sequence and Optional values (SplitToSequence / ConcatFromSequence, as torch exports list ops;
Optional) have no native kernels: they run in onnxruntime islands, and a sequence stays inside the
island that makes it even where a native step sits between its makers and its readers
(tests/test_lower_sequences.py). Unnamed nodes, as hand-written graphs have them, must still make a
valid island model (onnxruntime refuses two nodes of one name)."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from infc.compiler.build import BuildOptions, build
from infc.compiler.runtime.session import PlanSession
from infc.compiler.verify import ort_session


def _sequence_model() -> onnx.ModelProto:
    # the Cast between the two sequence groups is native: the island must take it in, not hand the list on
    nodes = [helper.make_node("SplitToSequence", ["x", "sizes"], ["seq"], axis=1),
             helper.make_node("SequenceLength", ["seq"], ["n"]),
             helper.make_node("SequenceAt", ["seq", "one"], ["second"]),
             helper.make_node("SequenceInsert", ["seq", "second"], ["longer"]),
             helper.make_node("Cast", ["n"], ["n_float"], to=TensorProto.FLOAT),
             helper.make_node("SequenceErase", ["longer", "zero"], ["shorter"]),
             helper.make_node("ConcatFromSequence", ["shorter"], ["joined"], axis=1),
             helper.make_node("Mul", ["joined", "n_float"], ["y"])]
    inits = [numpy_helper.from_array(np.array([1, 2, 3], np.int64), "sizes"),
             numpy_helper.from_array(np.array(1, np.int64), "one"), numpy_helper.from_array(np.array(0, np.int64), "zero")]
    graph = helper.make_graph(nodes, "lists", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "M"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _optional_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Optional", ["x"], ["maybe"]),
             helper.make_node("OptionalHasElement", ["maybe"], ["has"]),
             helper.make_node("OptionalGetElement", ["maybe"], ["got"]),
             helper.make_node("Cast", ["has"], ["has_float"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["got", "has_float"], ["y"])]
    graph = helper.make_graph(nodes, "optional", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def _build_and_compare(model: onnx.ModelProto, tmp_path) -> None:
    path, profile = tmp_path / "m.onnx", tmp_path / "p.yaml"
    onnx.save(model, path)
    profile.write_text("inputs:\n  x: {min: [1, 6], opt: [3, 6], max: [4, 6]}\n")
    build(str(path), str(profile), str(tmp_path / "m.plan"), BuildOptions(target="cpu", cache_dir=tmp_path / "cache",
                                                                         show_progress=False))
    session = PlanSession(tmp_path / "m.plan")
    for batch in (1, 4):
        x = np.random.default_rng(batch).standard_normal((batch, 6)).astype(np.float32)
        (want,) = ort_session(model).run(["y"], {"x": x})
        np.testing.assert_allclose(session.run({"x": x})["y"], want, rtol=1e-6, atol=1e-6)


def test_sequence_ops_around_a_native_step_build_and_match(tmp_path):
    _build_and_compare(_sequence_model(), tmp_path)


def test_unnamed_optional_ops_make_one_valid_island(tmp_path):
    _build_and_compare(_optional_model(), tmp_path)
