"""apply_precision, the CLI's entry point: each precision, repair on request, one-line errors."""

import numpy as np
import onnx
import pytest
from infc.compiler.errors import BadInput
from infc.compiler.quantize import apply_precision
from infc.compiler.testing import FIXTURES


@pytest.fixture(scope="module")
def overflow():
    return onnx.load(FIXTURES / "overflow_fp16.onnx")


def test_fp16_with_tolerance_repairs(overflow):
    model, report = apply_precision(overflow, "fp16", tolerance=1e-2)
    assert report["repair"]["pinned"] == [["wide_matmul", "MatMul"]] and report["repair"]["error_after"] <= 1e-2
    assert report["conversion"]["precision"] == "fp16" and model.graph.input[0].type.tensor_type.elem_type == 1


def test_fp16_without_tolerance_only_converts(overflow):
    _, report = apply_precision(overflow, "bf16")
    assert "repair" not in report and report["conversion"]["num_casts"] > 0


def test_int8_reads_a_calibration_folder(overflow, tmp_path):
    rng = np.random.default_rng(0)
    for index in range(4):
        np.savez(tmp_path / f"{index}.npz", x=rng.standard_normal((2, 7, 32)).astype(np.float32))
    _, report = apply_precision(overflow, "int8", calib=str(tmp_path), method="percentile")
    assert report["int8"]["num_samples"] == 4 and report["int8"]["quantized"] == {"MatMul": 2}


def test_repair_can_compare_on_calibration_samples(overflow, tmp_path):
    np.savez(tmp_path / "one.npz", x=np.random.default_rng(0).standard_normal((1, 5, 32)).astype(np.float32))
    _, report = apply_precision(overflow, "fp16", tolerance=1e-2, calib=str(tmp_path / "one.npz"))
    assert report["repair"]["is_within_tolerance"]


@pytest.mark.parametrize("precision, calib, message", [("int4", None, "expected one of fp16, bf16, int8"),
                                                        ("int8", None, "needs calibration data")])
def test_bad_requests_are_one_line_errors(overflow, precision, calib, message):
    with pytest.raises(BadInput, match=message):
        apply_precision(overflow, precision, calib=calib)
