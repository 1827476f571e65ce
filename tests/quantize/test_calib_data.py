"""Calibration data: one .npz, a stacked .npz, a folder of them; bad data fails with one line."""

import numpy as np
import pytest
from infc.compiler.errors import BadInput
from infc.compiler.quantize.calib_data import iter_calibration
from infc.compiler.testing import make_model
from onnx import helper

F32 = np.float32


@pytest.fixture
def model():
    nodes = [helper.make_node("Add", ["a", "b"], ["y"])]
    return make_model(nodes, [("a", F32, [1, 4]), ("b", F32, [1, 4])], [("y", F32, [1, 4])])


def _sample(value):
    return {"a": np.full((1, 4), value, F32), "b": np.full((1, 4), -value, F32)}


def test_one_sample_per_file_in_name_order(model, tmp_path):
    for index in (2, 0, 1):
        np.savez(tmp_path / f"s{index}.npz", **_sample(index))
    (tmp_path / "notes.txt").write_text("ignored")
    assert [s["a"][0, 0] for s in iter_calibration(tmp_path, model)] == [0, 1, 2]


def test_a_stacked_file_yields_its_samples(model, tmp_path):
    np.savez(tmp_path / "stack.npz", a=np.zeros((5, 1, 4), F32), b=np.ones((5, 1, 4), F32))
    samples = list(iter_calibration(tmp_path / "stack.npz", model))
    assert len(samples) == 5 and samples[0]["a"].shape == (1, 4)


def test_reading_is_lazy(model, tmp_path):
    np.savez(tmp_path / "a.npz", **_sample(1))
    (tmp_path / "b.npz").write_bytes(b"not a zip")
    samples = iter_calibration(tmp_path, model)
    assert next(samples)["a"][0, 0] == 1  # the broken second file is not touched yet
    with pytest.raises(BadInput, match="b.npz: not an .npz archive"):
        next(samples)


@pytest.mark.parametrize("arrays, message", [
    ({"a": np.zeros((1, 4), F32)}, "no array for model input"),
    ({"a": np.zeros(4, F32), "b": np.zeros(4, F32)}, "has rank 1, the input has rank 2"),
    ({"a": np.zeros((2, 1, 4), F32), "b": np.zeros((1, 4), F32)}, "either every input is a stack"),
])
def test_bad_files_name_the_problem(model, tmp_path, arrays, message):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(BadInput, match=message):
        list(iter_calibration(tmp_path / "bad.npz", model))


def test_missing_and_empty_paths(model, tmp_path):
    with pytest.raises(BadInput, match="no such calibration"):
        list(iter_calibration(tmp_path / "nope.npz", model))
    with pytest.raises(BadInput, match="no .npz files"):
        list(iter_calibration(tmp_path, model))
