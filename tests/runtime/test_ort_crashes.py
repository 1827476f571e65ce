"""Sessions over graphs that crash onnxruntime's optimizers are built with that optimizer off
(runtime/ort_crashes.py). The build runs in a child process: the crash is a segfault."""

import os
import subprocess
import sys

import pytest

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from infc.compiler.runtime.ort_crashes import optimizers_to_disable
from infc.compiler.verify import ort_session


def _nodes(with_cast: bool):
    cast = [helper.make_node("Cast", ["t"], ["t32"], to=TensorProto.FLOAT)] if with_cast else []
    return [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]), *cast,
            helper.make_node("MatMul", ["t32" if with_cast else "t", "w"], ["y"])]


def test_transpose_cast_matmul_turns_off_the_transpose_fusion():
    assert optimizers_to_disable(_nodes(with_cast=True)) == ["MatmulTransposeFusion"]
    assert optimizers_to_disable(_nodes(with_cast=False)) == []


@pytest.mark.parametrize("whole_model", ["0", "1"])  # also raced whole in one session (compiler/tune_whole.py)
def test_fp16_plan_of_a_sequence_first_projection_builds(tmp_path, whole_model):
    # the fp16 plan computes the Transpose in fp16 and the MatMul in fp32 between Casts: its
    # onnxruntime session held Transpose -> Cast -> MatMul, and the build died with SIGSEGV
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Transpose", ["h"], ["t"], perm=[1, 0, 2]),
             helper.make_node("MatMul", ["t", "w2"], ["y"])]
    weights = [numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), n) for n in ("w1", "w2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 2, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16, 32])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, tmp_path / "m.onnx")
    x = rng.standard_normal((16, 2, 32)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)

    def infc(*args):
        return subprocess.run([sys.executable, "-m", "infc.cli", *map(str, args)], capture_output=True, text=True,
                              env={**os.environ, "INFC_WHOLE_MODEL": whole_model})

    built = infc("build", tmp_path / "m.onnx", "-o", tmp_path / "m.plan", "--precision", "fp16", "--no-cache")
    assert built.returncode == 0, built.stderr[-2000:]
    ran = infc("run", tmp_path / "m.plan", "--inputs", tmp_path / "x.npz", "--outputs", tmp_path / "y.npz")
    assert ran.returncode == 0, ran.stderr[-2000:]
    (expected,) = ort_session(model).run(None, {"x": x})
    actual = np.load(tmp_path / "y.npz")["y"]
    assert np.abs(actual - expected).max() <= 1e-2 * np.abs(expected).max()


def _qdq_matmul_add(with_quantize: bool):
    tail = [helper.make_node("QuantizeLinear", ["z", "s", "zp"], ["q"])] if with_quantize else []
    return [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"]), *tail]


def test_matmul_add_before_a_quantize_stays_unfused():
    """MatMulAddFusion's Gemm sums in another order: a QuantizeLinear after it took values at its ties
    a step away from the model's (plans of QDQ MatMuls, fuzz_graphs seeds 489 and 726, which
    tests/test_fuzz_graphs.py runs end to end)."""
    assert optimizers_to_disable(_qdq_matmul_add(with_quantize=True)) == ["MatMulAddFusion"]
    assert optimizers_to_disable(_qdq_matmul_add(with_quantize=False)) == []
