"""The device executor on NumPy standing in for the device (backend.numpy_backend): the GPU path's
placement, host copies, GEMM sites (weights as (N, K), generated-kernel launches on the CPU
emulator), and arena offsets, checked against onnxruntime on the test models."""

from __future__ import annotations

import numpy as np
import pytest

from infc.compiler.build import _table_rows, sample_run, weights_section  # noqa: F401
from infc.compiler.build_cuda import gemm_sites
from infc.compiler.graph import import_graph
from infc.compiler.lower import lower_graph, value_info
from infc.compiler.model_io import load_model
from infc.compiler.optimize import optimize_model
from infc.compiler.profile import default_profile
from infc.compiler.runtime.cuda.arena import Arena, plan_arena
from infc.compiler.runtime.cuda.backend import numpy_backend
from infc.compiler.runtime.cuda.executor import DeviceExecutor
from infc.compiler.runtime.cuda.gemm import Choice, GemmSpec, weight_nk
from infc.compiler.runtime.cuda.ops import VIEW_OPS
from infc.compiler.runtime.feeds_io import random_inputs
from infc.compiler.runtime.kernels import has_kernel
from infc.compiler.verify import ort_session

from .conftest import EMULATED


def lowered(model_name: str):
    model = load_model(f"tests/models/{model_name}")
    program = lower_graph(import_graph(optimize_model(model).model), has_kernel)
    profile = default_profile([value_info(t) for t in import_graph(model).inputs])
    shapes = {}
    for level in ("min", "opt", "max"):
        _, shapes[level] = sample_run(program, random_inputs(program.inputs, profile.shapes(level), _table_rows(program), seed=1))
    return model, program, profile, shapes


def executor_for(program, shapes, launches):
    """Every GEMM site on the emulated kernel, outputs in the arena (as plan_loader wires them)."""
    specs, sizes = [], {}
    for site in gemm_sites(program, shapes):
        name = site.weight
        if site.layout == "kn":
            name = f"{site.weight}@nk"
            program.weights.setdefault(name, weight_nk(program.weights[site.weight], "kn"))
        specs.append(GemmSpec(site.step, name, site.n, site.k, (Choice(1 << 20, "kernel", EMULATED),)))
        out = program.steps[site.step]["outputs"][0]
        sizes[out] = int(np.prod(shapes["max"][out][0])) * 4
    names = [o["name"] for o in program.outputs]
    backend = numpy_backend()
    arena = Arena(plan_arena(program.steps, names, sizes, VIEW_OPS), np)
    return DeviceExecutor(program.steps, program.weights, program.opset, backend, islands=program.islands,
                          output_names=names, gemms=specs, launches=launches, arena=arena), specs


@pytest.mark.parametrize("model_name", ["cnn_ts.onnx", "bert_ts.onnx"])
def test_matches_onnxruntime_with_emulated_gemms_and_arena(model_name, emulated_kernels):
    model, program, profile, shapes = lowered(model_name)
    executor, specs = executor_for(program, shapes, {EMULATED: emulated_kernels[EMULATED]})
    names = executor.output_names
    feeds = random_inputs(program.inputs, profile.shapes("opt"), _table_rows(program), seed=4)
    expected = ort_session(model).run(names, feeds)
    first = executor.run(feeds)
    uploads_first = executor.backend.copies["to_device"]
    second = executor.run(feeds)  # the arena and the uploaded weights are reused
    for name, want in zip(names, expected):
        for got in (first[name], second[name]):
            assert type(got) is np.ndarray
            error = np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30)
            assert error <= 1e-4, f"{model_name} {name}: {error:.2e}"
        assert np.array_equal(first[name], second[name])
    report = executor.report()
    assert report["gemm_launches"] == {EMULATED: 2 * len(specs)}
    assert emulated_kernels[EMULATED].launches >= 2 * len(specs)
    assert executor.backend.copies["to_device"] - uploads_first < uploads_first  # weights went up once
    assert report["arena_bytes"] > 0 and executor.arena.num_fresh == 0


def test_bert_places_shape_arithmetic_on_the_host_and_reports_fallbacks(monkeypatch):
    from infc.compiler.runtime.cuda import ops

    _, program, _, _ = lowered("bert_ts.onnx")
    executor = DeviceExecutor(program.steps, program.weights, program.opset, numpy_backend(),
                              islands=program.islands)
    placed = executor.report()
    assert placed["placement"]["host (shape)"] > 0 and placed["placement"]["device"] > 0
    assert placed["host_fallback_ops"] == []
    monkeypatch.delitem(ops.DEVICE_OPS, ("com.microsoft", "MultiHeadAttention"))  # an op with no device version
    executor = DeviceExecutor(program.steps, program.weights, program.opset, numpy_backend(), islands=program.islands)
    assert executor.report()["host_fallback_ops"] == ["com.microsoft.MultiHeadAttention"]


def test_arena_keeps_viewed_bytes_alive():
    """y = gemm1 -> v = Reshape(y) -> z = gemm2 -> Add(v, z): y's bytes may not hold z while v lives."""
    steps = [{"op": "MatMul", "inputs": ["x", "w1"], "outputs": ["y"]},
             {"op": "Reshape", "inputs": ["y", "s"], "outputs": ["v"]},
             {"op": "MatMul", "inputs": ["x", "w2"], "outputs": ["z"]},
             {"op": "Add", "inputs": ["v", "z"], "outputs": ["out"]}]
    plan = plan_arena(steps, ["out"], {"y": 256, "z": 256}, VIEW_OPS)
    assert plan.offsets["y"] != plan.offsets["z"]
    no_views = plan_arena(steps, ["out"], {"y": 256, "z": 256}, set())
    assert no_views.offsets["y"] == no_views.offsets["z"]  # what the renaming prevents
