"""`infc build --verify` reports the plan's difference from onnxruntime on every build it was asked
for: on an engine-cache hit (it used to say nothing there) and for decoder plans (ignored before)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from infc.compiler.testing import FIXTURES, make_model

PROFILES = Path(__file__).resolve().parent.parent / "profiles"


def infc(*args):
    return subprocess.run([sys.executable, "-m", "infc.cli", *map(str, args)], capture_output=True, text=True)


def test_verify_runs_on_an_engine_cache_hit(tmp_path):
    w = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", np.float32, [2, 8])],
                       [("y", np.float32, [2, 8])], {"w": w})
    onnx.save(model, tmp_path / "m.onnx")
    args = ("build", tmp_path / "m.onnx", "-o", tmp_path / "p.plan", "--cache-dir", tmp_path / "cache", "--verify", "--json")
    first, second = (json.loads(infc(*args).stdout) for _ in range(2))
    assert first["cache_hit"] is False and second["cache_hit"] is True
    for report in (first, second):
        assert report["verify"]["max_rel_diff"] < 1e-5, report["verify"]
        assert report["verify"]["outputs"][0]["name"] == "y"
    text = infc(*args[:-1])
    assert text.returncode == 0 and "verify: max abs diff" in text.stdout, text.stdout


def test_verify_holds_a_decoder_plan_to_onnxruntime(tmp_path):
    args = ("build", FIXTURES / "llama_ts.onnx", "--profile", PROFILES / "llama_decode.yaml", "-o", tmp_path / "d.plan",
            "--cache-dir", tmp_path / "cache", "--verify", "--json")
    for expect_hit in (False, True):
        result = infc(*args)
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["cache_hit"] is expect_hit
        assert report["verify"]["max_rel_diff"] < 1e-4, report["verify"]
        assert report["verify"]["greedy_tokens_agree"] == "4/4"
        assert "onnxruntime on the original model" in report["verify"]["reference"]
