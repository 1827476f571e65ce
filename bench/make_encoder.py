"""A BERT-style encoder as plain ONNX, with seeded random weights, at any size: the test model for
comparing fp32 and fp16/bf16 plans on a GPU (bench/gpu_precision.py), where the fixtures in
tests/models are too small to be anything but launch-bound.

    python bench/make_encoder.py OUT.onnx [--layers 4] [--hidden 1024] [--heads 16] [--ffn 4096]

Each layer is what exporters write for a post-norm BERT layer, unfused: Q/K/V MatMul + Add, Reshape
and Transpose to heads, MatMul, Div by sqrt(d), Softmax, MatMul, output projection, residual Add,
LayerNormalization; then MatMul + Add, erf GELU written out (Div, Erf, Add, Mul, Mul), MatMul + Add,
residual Add, LayerNormalization. Input `hidden_states` (batch, sequence, hidden), opset 17.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET, IR_VERSION = 17, 8  # onnxruntime-loadable on every version infc supports


class _Graph:
    def __init__(self, rng: np.random.Generator):
        self.rng, self.nodes, self.inits, self._count = rng, [], [], 0

    def name(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def const(self, stem: str, array: np.ndarray) -> str:
        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, stem: str, rows: int, cols: int) -> str:
        return self.const(stem, (self.rng.standard_normal((rows, cols)) / math.sqrt(rows)).astype(np.float32))

    def bias(self, stem: str, size: int) -> str:
        return self.const(stem, (0.02 * self.rng.standard_normal(size)).astype(np.float32))

    def op(self, op_type: str, inputs: list[str], **attrs) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def linear(self, x: str, rows: int, cols: int, stem: str) -> str:
        return self.op("Add", [self.op("MatMul", [x, self.weight(stem, rows, cols)]), self.bias(stem + "_b", cols)])

    def layer_norm(self, x: str, size: int) -> str:
        scale = self.const("ln_w", (1 + 0.1 * self.rng.standard_normal(size)).astype(np.float32))
        return self.op("LayerNormalization", [x, scale, self.bias("ln_b", size)], axis=-1, epsilon=1e-12)


def _attention(g: _Graph, x: str, hidden: int, heads: int) -> str:
    head_dim = hidden // heads
    to_heads = g.const("heads_shape", np.array([0, 0, heads, head_dim], dtype=np.int64))
    q, k, v = (g.op("Transpose", [g.op("Reshape", [g.linear(x, hidden, hidden, stem), to_heads])],
                    perm=[0, 2, 3, 1] if stem == "k" else [0, 2, 1, 3]) for stem in ("q", "k", "v"))
    scores = g.op("Div", [g.op("MatMul", [q, k]), g.const("sqrt_d", np.array(math.sqrt(head_dim), np.float32))])
    context = g.op("Transpose", [g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])], perm=[0, 2, 1, 3])
    merged = g.op("Reshape", [context, g.const("merged_shape", np.array([0, 0, hidden], dtype=np.int64))])
    return g.linear(merged, hidden, hidden, "o")


def _gelu(g: _Graph, x: str) -> str:
    erf = g.op("Erf", [g.op("Div", [x, g.const("sqrt2", np.array(math.sqrt(2.0), np.float32))])])
    return g.op("Mul", [g.op("Mul", [x, g.op("Add", [erf, g.const("one", np.array(1.0, np.float32))])]),
                        g.const("half", np.array(0.5, np.float32))])


def make_encoder(layers: int = 4, hidden: int = 1024, heads: int = 16, ffn: int = 4096, seed: int = 0) -> onnx.ModelProto:
    if hidden % heads:
        raise ValueError(f"hidden {hidden} is not a multiple of heads {heads}")
    g = _Graph(np.random.default_rng(seed))
    x = "hidden_states"
    for _ in range(layers):
        x = g.layer_norm(g.op("Add", [x, _attention(g, x, hidden, heads)]), hidden)
        x = g.layer_norm(g.op("Add", [x, g.linear(_gelu(g, g.linear(x, hidden, ffn, "up")), ffn, hidden, "down")]), hidden)
    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "sequence", hidden])
          for n in ("hidden_states", "last_hidden_state")]
    graph = helper.make_graph(g.nodes, "encoder", io[:1], io[1:], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--ffn", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model = make_encoder(args.layers, args.hidden, args.heads, args.ffn, args.seed)
    tmp = args.output.with_name(args.output.name + ".tmp")
    onnx.save(model, tmp)
    tmp.replace(args.output)
    print(f"wrote {args.output} ({args.output.stat().st_size / 2**20:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
