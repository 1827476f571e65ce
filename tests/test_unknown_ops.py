"""The checker's unknown-op refusal, said plainly (compiler/unknown_ops.py): tf2onnx leaves TFLite
custom ops as nodes of their name and writes HardSwish below the opset that defines it."""

import subprocess
import sys

import numpy as np
import onnx
from onnx import helper

F32 = np.float32


def _model(path, opset: int, ops: list[str]):
    nodes, previous = [], "x"
    for index, op in enumerate(ops):
        nodes.append(helper.make_node(op, [previous], [f"y{index}"], name=f"n{index}"))
        previous = f"y{index}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info(previous, onnx.TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.save(model, path)
    return path


def _build(path, tmp_path):
    plan = tmp_path / "p.bin"
    result = subprocess.run([sys.executable, "-m", "infc.cli", "build", str(path), "-o", str(plan), "--no-cache"],
                            capture_output=True, text=True)
    assert plan.exists() == (result.returncode == 0)  # no partial plan from a refusal
    return result


def test_a_converters_custom_op_is_named_with_its_node(tmp_path):
    path = _model(tmp_path / "seg.onnx", 17, ["Relu", "TFL_Convolution2DTransposeBias", "TFL_TransformLandmarks"])
    result = _build(path, tmp_path)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "TFL_Convolution2DTransposeBias (node 'n1'), TFL_TransformLandmarks (node 'n2') are neither ONNX ops" in lines[0]
    assert "seg.onnx" in lines[0] and "unconverted" in lines[0]


def test_an_op_of_a_later_opset_says_which_opset(tmp_path):
    path = _model(tmp_path / "hs.onnx", 13, ["HardSwish", "Relu"])
    result = _build(path, tmp_path)
    assert result.returncode == 2, result.stderr
    assert ("HardSwish (node 'n0') is ONNX only from opset 14 and the model imports opset 13: convert it at opset 14"
            in result.stderr)


def test_the_same_op_at_its_opset_builds(tmp_path):
    result = _build(_model(tmp_path / "hs14.onnx", 14, ["HardSwish"]), tmp_path)
    assert result.returncode == 0 and "error:" not in result.stderr, result.stderr
