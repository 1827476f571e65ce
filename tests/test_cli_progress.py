"""Long-running work shows progress on a terminal and stays quiet when stderr is a pipe or with
--json (README: "On a terminal a build shows ..."). `optimize --precision int8` calibrated and
verified with no sign of life on a terminal; now it names each phase as the build does."""

import os
import pty
import subprocess
import sys

import numpy as np
import onnx
from onnx import helper

from infc.compiler.testing import make_model


def _model_and_calibration(folder):
    w = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    onnx.save(make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", np.float32, [2, 16])],
                         [("y", np.float32, [2, 8])], {"w": w}), folder / "m.onnx")
    np.savez(folder / "calib.npz", x=np.random.default_rng(1).standard_normal((4, 2, 16)).astype(np.float32))


def _stderr_on_a_terminal(args) -> str:
    leader, follower = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "infc.cli", *map(str, args)], stdout=subprocess.DEVNULL,
                               stderr=follower)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closes with the process
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert process.wait() == 0, seen
    return seen.decode(errors="replace")


def test_int8_optimize_names_its_phases_on_a_terminal_only(tmp_path):
    _model_and_calibration(tmp_path)
    args = ["optimize", tmp_path / "m.onnx", "-o", tmp_path / "q.onnx", "--precision", "int8",
            "--calib", tmp_path / "calib.npz", "--verify"]
    on_terminal = _stderr_on_a_terminal(args)
    assert "calibrating and quantizing to int8" in on_terminal and "verifying against onnxruntime" in on_terminal
    assert "calibrating" not in _stderr_on_a_terminal([*args, "--json"])
    piped = subprocess.run([sys.executable, "-m", "infc.cli", *map(str, args)], capture_output=True, text=True)
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
