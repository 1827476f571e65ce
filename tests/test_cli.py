"""The CLI contract (GUIDE.md section 8): JSON keys, one-line errors, exit codes, no partial output."""

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper

from infc.compiler.testing import FIXTURES, make_model

F32 = np.float32


def infc(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "infc.cli", *map(str, args)], capture_output=True, text=True, cwd=cwd)


def _small_model():
    nodes = [helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    return make_model(nodes, [("x", F32, ["batch", 4])], [("y", F32, ["batch", 4])])


def assert_bad_input(result, *fragments, code=2):
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_optimize_json_and_verify(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_small_model(), src)
    out = tmp_path / "out.onnx"
    result = infc("optimize", src, "-o", out, "--verify", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["nodes_before"] == 2 and report["nodes_after"] == 1
    assert report["rules"]["remove_identity"]["matched"] == 1
    assert report["max_abs_diff"] == 0.0
    assert onnx.load(out).graph.node[0].op_type == "Relu"


def test_optimize_verifies_on_given_inputs_and_checks_them(tmp_path):
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(_small_model(), src)
    good, wrong_name, wrong_dtype = tmp_path / "good.npz", tmp_path / "name.npz", tmp_path / "dtype.npz"
    np.savez(good, x=np.arange(-6, 6, dtype=F32).reshape(3, 4))
    np.savez(wrong_name, y=np.zeros((3, 4), F32))
    np.savez(wrong_dtype, x=np.zeros((3, 4), np.float64))
    result = infc("optimize", src, "-o", out, "--verify", "--json", "--inputs", good)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["max_abs_diff"] == 0.0
    assert_bad_input(infc("optimize", src, "-o", out, "--verify", "--inputs", wrong_name), str(wrong_name), "missing x")
    assert_bad_input(infc("optimize", src, "-o", out, "--verify", "--inputs", wrong_dtype), "dtype float64")


def test_inspect_json_lists_rejection_reasons_and_writes_html(tmp_path):
    nodes = [helper.make_node("Dropout", ["x"], ["y", "mask"])]
    model = make_model(nodes, [("x", F32, [2])], [("y", F32, [2]), ("mask", np.bool_, [2])])
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    html = tmp_path / "r.html"
    result = infc("inspect", src, "--json", "--html", html)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["rules"]["remove_dropout"]["rejected"] == {"its mask output is used": 1}
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "its mask output is used" in page


def test_unknown_op_in_declared_domain_passes_through(tmp_path):
    nodes = [helper.make_node("Frobnicate", ["x"], ["a"], domain="vendor.ops"), helper.make_node("Identity", ["a"], ["y"])]
    model = make_model(nodes, [("x", F32, [2])], [("y", F32, [2])], extra_opsets=[("vendor.ops", 1)])
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(model, src)
    result = infc("optimize", src, "-o", out, "--json")
    assert result.returncode == 0, result.stderr
    optimized = onnx.load(out)
    frob = [n for n in optimized.graph.node if n.op_type == "Frobnicate"]
    assert len(frob) == 1 and frob[0].domain == "vendor.ops"


@pytest.fixture
def bad_inputs(tmp_path):
    good = _small_model().SerializeToString()
    files = {}
    files["missing"] = tmp_path / "nope.onnx"
    (tmp_path / "text.onnx").write_text("this is not a model\n" * 10)
    files["not_onnx"] = tmp_path / "text.onnx"
    (tmp_path / "cut.onnx").write_bytes(good[: len(good) // 2])
    files["truncated"] = tmp_path / "cut.onnx"
    checker = _small_model()
    checker.graph.node[1].input[0] = "undefined_value"
    (tmp_path / "checker.onnx").write_bytes(checker.SerializeToString())
    files["checker"] = tmp_path / "checker.onnx"
    cycle = make_model([helper.make_node("Relu", ["x"], ["a"])], [("x", F32, [2])], [("a", F32, [2])])
    cycle.graph.node.extend([helper.make_node("Add", ["a", "c"], ["b"]), helper.make_node("Neg", ["b"], ["c"])])
    (tmp_path / "cycle.onnx").write_bytes(cycle.SerializeToString())
    files["cycle"] = tmp_path / "cycle.onnx"
    unknown = _small_model()
    unknown.graph.node[0].domain = "never.declared"
    (tmp_path / "domain.onnx").write_bytes(unknown.SerializeToString())
    files["unknown_domain"] = tmp_path / "domain.onnx"
    return files


@pytest.mark.parametrize("case,fragment", [
    ("missing", "no such file"),
    ("not_onnx", "not"),
    ("truncated", "not a valid ONNX protobuf"),
    ("checker", "checker rejects"),
    ("cycle", "cycle"),
    ("unknown_domain", "never.declared"),
])
def test_bad_model_gives_one_line_error_and_no_output(bad_inputs, tmp_path, case, fragment):
    out = tmp_path / "out.onnx"
    for command in (["optimize", bad_inputs[case], "-o", out], ["inspect", bad_inputs[case]]):
        result = infc(*command)
        assert_bad_input(result, str(bad_inputs[case]), fragment)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_unwritable_output_path(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_small_model(), src)
    assert_bad_input(infc("optimize", src, "-o", tmp_path / "no_such_dir" / "o.onnx"), "does not exist")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root ignores permission bits; /proc refuses even root
            assert_bad_input(infc("optimize", src, "-o", "/proc/infc_test.onnx"), "/proc/infc_test.onnx", "cannot write")
        else:
            assert_bad_input(infc("optimize", src, "-o", locked / "o.onnx"), "not writable")
    finally:
        locked.chmod(0o700)


def test_output_is_a_directory(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_small_model(), src)
    assert_bad_input(infc("optimize", src, "-o", tmp_path), "directory")


def test_fixture_optimizes_from_cli(tmp_path):
    result = infc("optimize", FIXTURES / "cnn_ts.onnx", "-o", tmp_path / "o.onnx", "--verify", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["max_rel_diff"] <= 1e-4
    assert report["nodes_after"] < report["nodes_before"]


def test_optimize_fp16_repairs_the_overflow_fixture(tmp_path):
    out = tmp_path / "o.onnx"
    result = infc("optimize", FIXTURES / "overflow_fp16.onnx", "-o", out, "--precision", "fp16", "--tolerance", "0.01",
                  "--verify", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["max_rel_diff"] <= 0.01
    assert report["quantize"]["repair"]["pinned"], "the overflowing node must be pinned to fp32"


def test_int8_without_calibration_data_is_bad_input(tmp_path):
    assert_bad_input(infc("optimize", FIXTURES / "cnn_ts.onnx", "-o", tmp_path / "o.onnx", "--precision", "int8"), "calib")
    assert not (tmp_path / "o.onnx").exists()


def test_a_reader_that_closes_stdout_ends_the_run_quietly(tmp_path):
    """`infc ... | head`: the write into the closed pipe was an internal error on stderr (exit 1)."""
    src = tmp_path / "m.onnx"
    onnx.save(_small_model(), src)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before infc writes anything
    try:
        result = subprocess.run([sys.executable, "-m", "infc.cli", "inspect", str(src), "--json"], stdout=write_end,
                                stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write_end)
    assert result.returncode == 141 and result.stderr == ""  # as if killed by SIGPIPE, and silent
