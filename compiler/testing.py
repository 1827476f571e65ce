"""Helpers for tests of passes: tiny models from node lists, one-pass pipelines, ORT comparison."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from .feeds import random_feeds
from .optimize import OptimizeResult, optimize_model
from .passes.cleanup.dead_code import RemoveDeadCode
from .passes.engine import RewritePass
from .passes.fold.shape_inference import InferShapes
from .passes.pipeline import Phase, Step
from .verify import compare_outputs, ort_session

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "models"
# Tolerances by dtype (GUIDE.md section 5).
RTOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float16): 2e-3}


def make_model(nodes, inputs, outputs, initializers=(), opset: int = 17, extra_opsets=()) -> onnx.ModelProto:
    """`inputs`/`outputs`: (name, np dtype, shape) triples; `initializers`: name -> array."""
    def info(name, dtype, shape):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)

    graph = helper.make_graph(
        list(nodes), "test", [info(*i) for i in inputs], [info(*o) for o in outputs],
        [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in dict(initializers).items()])
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    onnx.checker.check_model(model)
    return model


def run_rules(model: onnx.ModelProto, rules, name: str = "under_test", infer_shapes: bool = True) -> OptimizeResult:
    """Run just `rules` (after shape inference, as in the real pipeline) and return the result."""
    steps = ((Step(InferShapes(), "shapes for checks"),) if infer_shapes else ()) + (
        Step(RewritePass(name, rules), "under test"), Step(RemoveDeadCode(), "tidy"))
    return optimize_model(model, (Phase("test", steps),))


def rule_stats(result: OptimizeResult, rule: str) -> tuple[int, dict[str, int]]:
    matched, rejected = 0, {}
    for stats in result.pipeline.stats:
        if rule in stats.rules:
            matched += stats.rules[rule].matched
            for reason, n in stats.rules[rule].rejected().items():
                rejected[reason] = rejected.get(reason, 0) + n
    return matched, rejected


def ops_of(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def assert_matches_ort(original: onnx.ModelProto, optimized: onnx.ModelProto, seed: int = 0, feeds=None,
                       rtol: float | None = None, dims=None) -> None:
    """Both models in onnxruntime (graph optimizations off) on seeded random data; on failure,
    say which output and where the largest difference is."""
    feeds = feeds if feeds is not None else random_feeds(original, seed, dims)
    names = [o.name for o in original.graph.output]
    expected = ort_session(original).run(names, feeds)
    actual = ort_session(optimized).run(names, feeds)
    for diff, ref in zip(compare_outputs(names, expected, actual), expected):
        limit = rtol if rtol is not None else RTOL.get(np.asarray(ref).dtype, 1e-5)
        assert diff.max_rel_diff <= limit, (
            f"output {diff.name}: max rel diff {diff.max_rel_diff:.3g} > {limit:g} "
            f"(max abs {diff.max_abs_diff:.3g} at index {diff.worst_index})")


def lowered_and_observed(model: onnx.ModelProto, feeds_by_level: dict[str, dict[str, np.ndarray]]):
    """(program, seen): the model optimized and lowered as an fp32 `infc build` does, and per
    profile level {value: (shape, dtype name)} for every value its sample run at those feeds saw,
    the graph inputs included (what the build's tuners read)."""
    from .build import sample_run  # noqa: PLC0415 - the build pulls in the tuners: only tests that lower need it
    from .graph import import_graph  # noqa: PLC0415
    from .lower import lower_graph  # noqa: PLC0415
    from .runtime.kernels import has_kernel  # noqa: PLC0415

    program = lower_graph(import_graph(optimize_model(model).model), has_kernel)
    seen = {}
    for level, feeds in feeds_by_level.items():
        _, shapes = sample_run(program, feeds)
        seen[level] = {**{name: (tuple(np.shape(v)), np.asarray(v).dtype.name) for name, v in feeds.items()}, **shapes}
    return program, seen


def random_block_codes(rng, k: int, n: int, group: int, dtype, uint8_high: int = 256):
    """Random weight-only quantized operands of a (k, n) weight in blocks of `group` rows along k:
    codes, float32 scales and zero points ((ceil(k / group), n)); int8 in [-127, 127], uint8 in
    [0, uint8_high) (16: 4-bit values held in bytes)."""
    low, high = (-127, 128) if dtype == np.int8 else (0, uint8_high)
    blocks = -(-k // group)
    codes = rng.integers(low, high, (k, n)).astype(dtype)
    scale = (rng.random((blocks, n), dtype=np.float32) * 0.01 + 1e-3).astype(np.float32)
    zero = rng.integers(low, high, (blocks, n)).astype(dtype)
    return codes, scale, zero


def ort_optimized_ops(model: onnx.ModelProto, folder: Path) -> Counter:
    """The ops onnxruntime actually runs after its own graph optimizations (QDQ fusion included)."""
    import onnxruntime as ort  # noqa: PLC0415

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(Path(folder) / "ort_optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return Counter(n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node)
