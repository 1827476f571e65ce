"""Shared fixtures for runtime kernel tests: build a tiny model, run it natively (no passes, no
fallback) and in onnxruntime (graph optimizations off), compare with the dtype's tolerance."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from infc.compiler.graph import import_graph
from infc.compiler.lower import lower_graph
from infc.compiler.runtime.executor import Executor
from infc.compiler.runtime.kernels import has_kernel
from infc.compiler.testing import RTOL
from infc.compiler.verify import compare_outputs, ort_session

MS = "com.microsoft"


def lowered(model, allow_fallback: bool = False):
    graph = import_graph(model)
    program = lower_graph(graph, has_kernel, allow_fallback=allow_fallback)
    # lower_graph stores weights through np.ascontiguousarray, which turns 0-d constants into 1-d
    # ones; restore the graph's shapes until lowering keeps them (reported to the lead).
    shapes = {name: np.shape(t.values) for name, t in graph.tensors().items() if hasattr(t, "values")}
    program.weights = {k: v.reshape(shapes.get(k, v.shape)) for k, v in program.weights.items()}
    return program


def executor_for(model, allow_fallback: bool = False) -> Executor:
    program = lowered(model, allow_fallback)
    return Executor(program.steps, program.weights, program.opset, program.islands,
                    [o["name"] for o in program.outputs])


def run_native(model, feeds: dict) -> dict:
    return executor_for(model).run(feeds)


def check_against_ort(model, feeds: dict, rtol: float | None = None) -> dict:
    names = [o.name for o in model.graph.output]
    expected = ort_session(model).run(names, feeds)
    actual = run_native(model, feeds)
    for name, ref in zip(names, expected):
        assert actual[name].dtype == ref.dtype, f"output {name}: dtype {actual[name].dtype} != {ref.dtype}"
    for diff, ref in zip(compare_outputs(names, expected, [actual[n] for n in names]), expected):
        limit = rtol if rtol is not None else RTOL.get(np.asarray(ref).dtype, 0.0)
        assert diff.max_rel_diff <= limit, (
            f"output {diff.name}: max rel diff {diff.max_rel_diff:.3g} > {limit:g} "
            f"(max abs {diff.max_abs_diff:.3g} at index {diff.worst_index})")
    return actual


def node_model(op: str, feeds: dict, outputs, attrs=None, initializers=None, opset: int = 17,
               domain: str = "", input_names=None):
    """One node over `feeds` (name -> array, in input order, "" for an omitted input) and
    `initializers`; `outputs` are (name, dtype) pairs."""
    initializers = dict(initializers or {})
    names = input_names or list(feeds) + list(initializers)
    node = helper.make_node(op, names, [o[0] for o in outputs], domain=domain or None, **(attrs or {}))
    return graph_model([node], {n: a for n, a in feeds.items() if n}, outputs, initializers, opset)


def graph_model(nodes, feeds: dict, outputs, initializers=None, opset: int = 17):
    """Like testing.make_model, but output shapes may stay unknown and contrib ops need no schema check."""
    def info(name, dtype, shape):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)

    graph = helper.make_graph(nodes, "test", [info(n, a.dtype, list(a.shape)) for n, a in feeds.items()],
                              [info(n, d, None) for n, d in outputs],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()])
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


@pytest.fixture
def ort_check():
    return check_against_ort


@pytest.fixture
def native():
    return run_native


@pytest.fixture
def single_node():
    return node_model


@pytest.fixture
def graph_of():
    return graph_model


@pytest.fixture
def rng():
    return np.random.default_rng(0)
