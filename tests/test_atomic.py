"""Outputs appear whole or not at all, with the permissions a plain open() gives."""

import os
import stat

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from infc.compiler.atomic import atomic_path, write_text_atomic
from infc.compiler.model_io import save_model


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _plain_mode(tmp_path) -> int:
    probe = tmp_path / "probe"
    probe.write_text("x")
    return _mode(probe)


def test_finished_file_has_plain_permissions_and_no_leftovers(tmp_path):
    target = tmp_path / "out.json"
    write_text_atomic(target, "{}")
    assert target.read_text() == "{}" and _mode(target) == _plain_mode(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "probe"]


def test_failure_leaves_neither_the_file_nor_a_temporary(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"partial")
            raise RuntimeError("crash while writing")
    assert list(tmp_path.iterdir()) == []


def test_large_model_with_external_data_is_written_whole(tmp_path, monkeypatch):
    import infc.compiler.model_io as model_io

    monkeypatch.setattr(model_io, "EXTERNAL_DATA_THRESHOLD_BYTES", 1)  # force the external-data path
    weight = np.arange(4096, dtype=np.float32).reshape(64, 64)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
                              [onnx.numpy_helper.from_array(weight, "w")])
    save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "m.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]
    loaded = onnx.load(str(tmp_path / "m.onnx"))
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(loaded.graph.initializer[0]), weight)
    assert _mode(tmp_path / "m.onnx") == _mode(tmp_path / "m.onnx.data") == _plain_mode(tmp_path)
