"""String inputs and outputs through the CLI (classic-ML graphs: a LabelEncoder from and to text,
string class labels): .npz files hold text as <U arrays, never pickled objects, both ways."""

import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

from infc.compiler.verify import ort_session


def _text_model() -> onnx.ModelProto:
    nodes = [helper.make_node("LabelEncoder", ["animal"], ["code"], domain="ai.onnx.ml", keys_strings=["cat", "dog"],
                              values_int64s=[1, 2], default_int64=-1),
             helper.make_node("LabelEncoder", ["animal"], ["sound"], domain="ai.onnx.ml", keys_strings=["cat", "dog"],
                              values_strings=["meow", "woof"], default_string="?"),
             helper.make_node("Mul", ["code", "code"], ["squared"])]
    graph = helper.make_graph(nodes, "text", [helper.make_tensor_value_info("animal", TensorProto.STRING, ["n"])],
                              [helper.make_tensor_value_info("sound", TensorProto.STRING, ["n"]),
                               helper.make_tensor_value_info("squared", TensorProto.INT64, ["n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 2)],
                              ir_version=8)
    onnx.checker.check_model(model)
    return model


def _infc(*args):
    return subprocess.run([sys.executable, "-m", "infc.cli", *map(str, args)], capture_output=True, text=True)


def test_text_feeds_and_outputs_round_trip_through_npz(tmp_path):
    model = _text_model()
    onnx.save(model, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text("inputs: {animal: {min: [1], opt: [3], max: [8]}}\n")
    built = _infc("build", tmp_path / "m.onnx", "--profile", tmp_path / "p.yaml", "-o", tmp_path / "m.plan", "--no-cache")
    assert built.returncode == 0, built.stderr
    animals = np.array(["dog", "cat", "eel"])  # <U3, as np.savez stores text
    np.savez(tmp_path / "in.npz", animal=animals)
    ran = _infc("run", tmp_path / "m.plan", "--inputs", tmp_path / "in.npz", "--outputs", tmp_path / "out.npz")
    assert ran.returncode == 0, ran.stderr
    with np.load(tmp_path / "out.npz") as out:  # allow_pickle=False
        sound, squared = out["sound"], out["squared"]
    expected_sound, expected_squared = ort_session(model).run(["sound", "squared"], {"animal": animals.astype(object)})
    assert sound.dtype.kind == "U" and sound.tolist() == list(expected_sound) == ["woof", "meow", "?"]
    np.testing.assert_array_equal(squared, expected_squared)
