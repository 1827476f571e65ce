"""Generated elementwise-chain kernels (compiler/codegen/chain_kernel.py): every chain of the test models
and one chain using every op form compile to sm_90 cubins without spills, and on the CPU emulator they
match the CPU runtime's chain kernel on broadcast shapes (runtime/kernels/chain.py)."""

from __future__ import annotations

import numpy as np
import pytest

from infc.compiler.codegen import emulate
from infc.compiler.codegen.cache import CubinCache
from infc.compiler.codegen.chain_kernel import FORMS, UnsupportedChain, arg_types, render_chain
from infc.compiler.codegen.compile import compile_source, find_nvcc
from infc.compiler.graph import import_graph
from infc.compiler.lower import lower_graph
from infc.compiler.model_io import load_model
from infc.compiler.optimize import optimize_model
from infc.compiler.runtime.cuda.chain import ChainRunner, chain_layout
from infc.compiler.runtime.cuda.executor import DeviceContext
from infc.compiler.runtime.kernels import has_kernel
from infc.compiler.runtime.kernels.chain import INTO, elementwise_chain
from infc.compiler.runtime.kernels.common import KernelContext

# inputs: x (2, 3, 8), s (8,), r (3, 1), lo, hi scalars; every op form of FORMS and both Clip forms, each
# op reading the previous result (arg -1 - k is op k's result)
EVERY_OP_FORMS = [
    ("Mul", [0, 1], {}), ("Add", ["prev", 2], {}), ("HardSwish", ["prev"], {}), ("Sigmoid", ["prev"], {}),
    ("Sub", ["prev", 1], {}), ("LeakyRelu", ["prev"], {"alpha": 0.1}), ("Tanh", ["prev"], {}), ("Abs", ["prev"], {}),
    ("Sqrt", ["prev"], {}), ("Neg", ["prev"], {}), ("Exp", ["prev"], {}), ("Div", ["prev", 2], {}), ("Relu", ["prev"], {}),
    ("HardSigmoid", ["prev"], {"alpha": 0.3, "beta": 0.4}), ("Add", ["prev", 0], {}), ("Clip", ["prev", 3, 4], {}),
    ("Clip", ["prev"], {"min": -0.5}),
]
EVERY_OP = [{"op": op, "args": [-k if a == "prev" else a for a in args], "attrs": attrs}
            for k, (op, args, attrs) in enumerate(EVERY_OP_FORMS)]

def model_chains() -> list[dict]:
    chains = []
    for name in ("bert_ts.onnx", "gpt2_ts.onnx", "cnn_dynamo.onnx", "llama_ts.onnx"):
        program = lower_graph(import_graph(optimize_model(load_model(f"tests/models/{name}")).model), has_kernel)
        chains += [s for s in program.steps if s["op"] == "ElementwiseChain"]
    return chains


def test_every_chain_op_has_a_form():
    covered = set(FORMS) | {"Clip"}
    assert {op for _, op in INTO} == covered
    with pytest.raises(UnsupportedChain):
        render_chain([{"op": "Erf", "args": [0]}], 1)


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc (CUDA 13.0) not installed")
def test_chains_compile_for_sm90_without_spills(cubin_dir):
    chains = [(s["attrs"]["ops"], len(s["inputs"])) for s in model_chains()] + [(EVERY_OP, 5)]
    assert len(chains) > 3
    for ops, num_inputs in chains:
        source, entry = render_chain(ops, num_inputs)
        compiled = compile_source(source, entry, CubinCache(cubin_dir))
        assert compiled.cubin.read_bytes()[:4] == b"\x7fELF"
        assert not compiled.resources.has_spills and 0 < compiled.resources.registers <= 64


def test_layout_strides_broadcast():
    layout = chain_layout([(2, 3, 8), (8,), (3, 1), ()], (2, 3, 8))
    assert layout.tolist() == [2, 3, 8, 24, 8, 1, 0, 0, 1, 0, 1, 0, 0, 0, 0]


def test_emulated_chain_matches_the_cpu_kernel(needs_cxx, emu_dir):
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal((2, 3, 8)).astype(np.float32), rng.standard_normal(8).astype(np.float32),
              (rng.random((3, 1)) + 0.5).astype(np.float32), np.float32(-2.0).reshape(()), np.float32(3.0).reshape(())]
    source, entry = render_chain(EVERY_OP, len(inputs))
    function = emulate.Function(source, entry, arg_types(len(inputs)), emu_dir)
    runner = ChainRunner(function, len(inputs), num_sms=1)
    ctx = DeviceContext(np, None, 17, [None])
    got = runner(inputs, ctx)
    want = elementwise_chain(inputs, {"ops": EVERY_OP}, KernelContext(17, [None]))[0]
    assert got.shape == want.shape and np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    assert function.launches == 1 and runner(inputs, ctx) is not got  # a fresh output each run
    assert len(ctx.memo) == 1  # the layout is computed once per set of shapes


@pytest.mark.parametrize("domain, op, attrs", [("", "Sigmoid", {}), ("", "HardSigmoid", {"alpha": 0.25, "beta": 0.4}),
                                               ("", "HardSwish", {}), ("", "LeakyRelu", {"alpha": 0.2}),
                                               ("com.microsoft", "QuickGelu", {"alpha": 1.0}),
                                               ("com.microsoft", "QuickGelu", {})])
def test_a_standalone_activation_is_a_one_op_chain_matching_its_cpu_kernel(domain, op, attrs, needs_cxx, emu_dir):
    from infc.compiler.codegen.chain_kernel import SINGLE_OP_CHAINS, chain_ops
    from infc.compiler.runtime.kernels import kernel_for

    assert (domain, op) in SINGLE_OP_CHAINS
    step = {"op": op, "domain": domain, "inputs": ["x"], "outputs": ["y"], "attrs": attrs}
    x = (np.random.default_rng(5).standard_normal((3, 50)) * 4).astype(np.float32)
    source, entry = render_chain(chain_ops(step), 1)
    runner = ChainRunner(emulate.Function(source, entry, arg_types(1), emu_dir), 1, num_sms=1)
    got = runner([x], DeviceContext(np, None, 17, [None]))
    want = kernel_for(domain, op)([x], attrs, KernelContext(17, [None]))[0]
    # the CPU kernels' sigmoid is exp-based, the chain's the tanh form: float32 rounding apart
    assert got.shape == want.shape and np.abs(got - want).max() <= 1e-6 * np.abs(want).max()
    assert chain_ops({**step, "op": "Erf", "domain": ""}) is None
