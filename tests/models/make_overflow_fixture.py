#!/usr/bin/env python
"""Write tests/models/overflow_fp16.onnx: a tiny model whose activations overflow fp16.

    x[batch, seq, 32] -> MatMul(W1 * 8000) -> Add(b1) -> LayerNormalization -> MatMul(W2) -> Add(b2) -> y

The first MatMul's outputs reach ~1e5 (fp16 stops at 65504) and are normalized right after, so the
fp32 model is well behaved while a naive fp16 conversion turns them into inf and the LayerNorm into
NaN. The quantize tests prove that `repair_precision` finds and pins that MatMul.

    python tests/models/make_overflow_fixture.py     # deterministic: byte-identical output
"""

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

HERE = Path(__file__).resolve().parent
HIDDEN, WIDTH, OUT = 32, 64, 16
WEIGHT_SCALE = 8000.0  # |W1| stays below 65504; x @ W1 does not
FP16_MAX = 65504.0


def build() -> onnx.ModelProto:
    rng = np.random.default_rng(2026)
    weights = {
        "w1": (rng.standard_normal((HIDDEN, WIDTH)) * WEIGHT_SCALE).astype(np.float32),
        "b1": rng.standard_normal(WIDTH).astype(np.float32),
        "gamma": (1 + 0.1 * rng.standard_normal(WIDTH)).astype(np.float32),
        "beta": (0.1 * rng.standard_normal(WIDTH)).astype(np.float32),
        "w2": (rng.standard_normal((WIDTH, OUT)) / np.sqrt(WIDTH)).astype(np.float32),
        "b2": (0.1 * rng.standard_normal(OUT)).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["wide"], name="wide_matmul"),
        helper.make_node("Add", ["wide", "b1"], ["wide_biased"], name="wide_bias"),
        helper.make_node("LayerNormalization", ["wide_biased", "gamma", "beta"], ["normed"], name="norm", axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["normed", "w2"], ["proj"], name="proj_matmul"),
        helper.make_node("Add", ["proj", "b2"], ["y"], name="proj_bias"),
    ]
    graph = helper.make_graph(
        nodes, "overflow_fp16",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", "seq", HIDDEN])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", "seq", OUT])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10,
                              producer_name="infc tests/models/make_overflow_fixture.py")
    onnx.checker.check_model(model)
    return model


def check(model: onnx.ModelProto) -> None:
    """fp32 runs and is finite while the intermediate really overflows fp16."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(helper.make_tensor_value_info("wide", onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((2, 7, HIDDEN)).astype(np.float32)
    y, wide = session.run(None, {"x": x})
    assert np.isfinite(y).all() and np.abs(y).max() < 10, "the fp32 output should be normalized"
    assert np.abs(wide).max() > 2 * FP16_MAX, f"intermediate max {np.abs(wide).max():.0f} should overflow fp16"


if __name__ == "__main__":
    model = build()
    check(model)
    onnx.save(model, str(HERE / "overflow_fp16.onnx"))
    print(f"wrote {HERE / 'overflow_fp16.onnx'}")
