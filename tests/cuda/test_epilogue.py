"""Fused GEMM epilogues (compiler/codegen/epilogue_match.py, runtime/cuda/gemm.py): which steps a site
absorbs, and the device executor running the sites with the epilogue in the generated kernel (on the
CPU emulator), or as separate ops after an unfused kernel or cuBLAS, against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from infc.compiler.build import _table_rows
from infc.compiler.build_cuda import gemm_sites
from infc.compiler.codegen.epilogue_match import match_epilogue
from infc.compiler.codegen.variants import Epilogue, variant_named, with_epilogue
from infc.compiler.runtime.cuda.arena import Arena, plan_arena
from infc.compiler.runtime.cuda.backend import numpy_backend
from infc.compiler.runtime.cuda.executor import DeviceExecutor
from infc.compiler.runtime.cuda.gemm import Choice, GemmSpec, device_steps, weight_nk
from infc.compiler.runtime.cuda.ops import VIEW_OPS
from infc.compiler.runtime.feeds_io import random_inputs
from infc.compiler.verify import ort_session

from .conftest import EMULATED
from .test_executor import lowered

F32 = np.float32


def _kinds(program, shapes):
    outputs = {o["name"] for o in program.outputs}
    found = []
    for site in gemm_sites(program, shapes):
        e = match_epilogue(program.steps, site.step, program.weights, site.n, outputs, shapes)
        found.append(None if e is None else (e.bias is not None, e.act, e.residual is not None, len(e.absorbed)))
    return found


def test_matches_on_the_test_models():
    _, bert, _, bert_shapes = lowered("bert_ts.onnx")
    # QKV bias Add; BiasGelu; the output projection and the FFN output feed SkipLayerNormalization
    # (not an epilogue: the shape walk now proves both residual norms' shapes)
    assert sorted(map(str, _kinds(bert, bert_shapes))) == sorted(map(str, 2 * [
        (True, "none", False, 1), (True, "gelu", False, 1), None, None]))
    _, cnn, _, cnn_shapes = lowered("cnn_ts.onnx")
    kinds = _kinds(cnn, cnn_shapes)
    assert (True, "relu", False, 0) in kinds and (True, "none", False, 0) in kinds  # own bias (+ Relu)


def _site(steps, weights, shapes, outputs=("y",)):
    return match_epilogue(steps, 0, weights, 4, set(outputs), shapes)


def test_what_is_not_absorbed():
    w, b = np.ones((3, 4), F32), np.ones(4, F32)
    shape = {"min": {n: ((2, 4), "float32") for n in ("m", "r", "late", "t", "y")}}
    mm = {"op": "MatMul", "inputs": ["x", "w"], "outputs": ["m"]}
    add_b = {"op": "Add", "inputs": ["m", "b"], "outputs": ["t"]}
    weights = {"w": w, "b": b}
    spec = _site([mm, add_b, {"op": "Add", "inputs": ["t", "r"], "outputs": ["y"]}], weights, shape)
    assert (spec.bias, spec.residual, spec.absorbed, spec.output) == ("b", "r", (1, 2), "y")
    # a residual computed after the site cannot be read by its launch
    late = [mm, add_b, {"op": "Relu", "inputs": ["x"], "outputs": ["late"]}, {"op": "Add", "inputs": ["t", "late"], "outputs": ["y"]}]
    assert _site(late, weights, shape).absorbed == (1,)
    # the GEMM output read twice: nothing absorbed
    twice = [mm, add_b, {"op": "Add", "inputs": ["m", "t"], "outputs": ["y"]}]
    assert _site(twice, weights, shape) is None
    # out of order (activation before bias), tanh GELU, a chain that is not all epilogue
    assert _site([mm, {"op": "Relu", "inputs": ["m"], "outputs": ["t"]}, {"op": "Add", "inputs": ["t", "b"], "outputs": ["y"]}],
                 weights, shape).absorbed == (1,)
    assert _site([mm, {"op": "Gelu", "inputs": ["m"], "outputs": ["y"], "attrs": {"approximate": "tanh"}}], weights, shape) is None
    chain = {"op": "ElementwiseChain", "domain": "infc.cpu", "inputs": ["m", "b"], "outputs": ["y"],
             "attrs": {"ops": [{"op": "Add", "args": [0, 1]}, {"op": "Exp", "args": [-1]}]}}
    assert _site([mm, chain], weights, shape) is None
    chain["attrs"]["ops"][1] = {"op": "Relu", "args": [-1]}
    assert _site([mm, chain], weights, shape).act == "relu"
    # a program output is never an intermediate
    assert _site([mm, add_b], weights, shape, outputs=("m", "t")) is None


def test_a_16_bit_sites_epilogue_goes_through_its_rounding():
    """MatMul -> Cast(bf16) -> Cast(fp32) -> BiasGelu: the launch adds the bias and applies GELU to the fp32
    accumulator; the program's rounding after BiasGelu rounds once. Nothing to absorb after the round
    trip, a low value read elsewhere, or a round trip to another type: no epilogue (the site rounds)."""
    weights = {"w": np.ones((3, 4), F32), "b": np.ones(4, F32)}
    shape = {"min": {n: ((2, 4), "float32") for n in ("m", "m32", "g", "g32", "y")}}
    steps = [{"op": "MatMul", "inputs": ["x", "w"], "outputs": ["m"]},
             {"op": "Cast", "inputs": ["m"], "outputs": ["m16"], "attrs": {"to": 16}},
             {"op": "Cast", "inputs": ["m16"], "outputs": ["m32"], "attrs": {"to": 1}},
             {"op": "BiasGelu", "domain": "com.microsoft", "inputs": ["m32", "b"], "outputs": ["g"]},
             {"op": "Cast", "inputs": ["g"], "outputs": ["g16"], "attrs": {"to": 16}},
             {"op": "Cast", "inputs": ["g16"], "outputs": ["y"], "attrs": {"to": 1}}]
    spec = match_epilogue(steps, 0, weights, 4, {"y"}, shape, through_low=16)
    assert (spec.bias, spec.act, spec.absorbed, spec.output) == ("b", "gelu", (1, 2, 3), "g")
    assert match_epilogue(steps, 0, weights, 4, {"y"}, shape, through_low=10) is None  # a bf16 trip, not fp16
    assert match_epilogue(steps[:3], 0, weights, 4, {"m32"}, shape, through_low=16) is None  # nothing after it
    shared = [*steps, {"op": "Relu", "inputs": ["m16"], "outputs": ["z"]}]
    assert match_epilogue(shared, 0, weights, 4, {"y", "z"}, shape, through_low=16) is None
    assert match_epilogue(steps, 0, weights, 4, {"y"}, shape) is None  # an fp32 site reads no Cast as an epilogue


def _executor(program, shapes, launches, impl: str):
    """Every site on the emulated tile: `impl` "fused" (the epilogue in the launch), "kernel" (plain
    launch + separate ops) or "cublas"."""
    outputs = {o["name"] for o in program.outputs}
    specs, sizes = [], {}
    for site in gemm_sites(program, shapes):
        name = site.weight
        if site.layout == "kn":
            name = f"{site.weight}@nk"
            program.weights.setdefault(name, weight_nk(program.weights[site.weight], "kn"))
        epilogue = match_epilogue(program.steps, site.step, program.weights, site.n, outputs, shapes)
        kernel = EMULATED
        if epilogue is not None and impl == "fused":
            kernel = with_epilogue(variant_named(EMULATED), Epilogue(
                bias=epilogue.bias is not None, act=epilogue.act, residual=epilogue.residual is not None)).name
        choice = Choice(1 << 20, "cublas") if impl == "cublas" else Choice(1 << 20, "kernel", kernel, impl == "fused")
        spec = GemmSpec(site.step, name, site.n, site.k, (choice,), epilogue)
        specs.append(spec)
        out = epilogue.output if epilogue else program.steps[site.step]["outputs"][0]
        sizes[out] = int(np.prod(shapes["max"][out][0])) * 4
    names = [o["name"] for o in program.outputs]
    steps = [s for _, s in device_steps(program.steps, specs)]
    arena = Arena(plan_arena(steps, names, sizes, VIEW_OPS), np)
    kernels = {c.kernel for s in specs for c in s.choices if c.kernel}
    return DeviceExecutor(program.steps, program.weights, program.opset, numpy_backend(), islands=program.islands,
                          output_names=names, gemms=specs, launches={k: launches[k] for k in kernels}, arena=arena), specs


@pytest.mark.parametrize("model_name", ["bert_ts.onnx", "cnn_ts.onnx", "gpt2_ts.onnx"])
def test_fused_sites_match_onnxruntime(model_name, emulated_kernels):
    model, program, profile, shapes = lowered(model_name)
    feeds = random_inputs(program.inputs, profile.shapes("opt"), _table_rows(program), seed=4)
    expected = ort_session(model).run([o["name"] for o in program.outputs], feeds)
    num_steps = {}
    for impl in ("fused", "kernel", "cublas"):
        executor, specs = _executor(program, shapes, emulated_kernels, impl)
        actual = executor.run(feeds)
        for name, want in zip(executor.output_names, expected):
            error = np.abs(actual[name].astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30)
            assert error <= 1e-4, f"{model_name} {impl} {name}: {error:.2e}"
        launched = executor.report()["gemm_launches"]
        fused = {c.kernel for s in specs for c in s.choices if c.fused}
        assert bool(fused) == (impl == "fused") and set(fused) <= set(launched)
        num_steps[impl] = len(executor._steps)
        assert executor.arena.num_fresh == 0
    absorbed = sum(len(s.epilogue.absorbed) for s in specs if s.epilogue)
    assert num_steps["fused"] == len(program.steps) - absorbed
    assert absorbed > 0 or model_name != "bert_ts.onnx"
