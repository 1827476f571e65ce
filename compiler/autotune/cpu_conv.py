"""CPU convolution tactics: infc's own kernels against onnxruntime's (the vendor), per convolution shape.

A Conv / com.microsoft.FusedConv step of a plan runs either on infc's kernel for its shape
(runtime/kernels/conv.py picks pointwise, depthwise, per-tap, phase-layout or compiled direct
paths) or, as the vendor tactic, in a one-node onnxruntime session (runtime/vendor_op.py). Which
is faster depends on the shape and the machine: onnxruntime's blocked direct convolutions win the
large dense ones, infc's compiled kernels the small and depthwise ones, where a session call's
~30 us is most of the time. So it is measured, like a GEMM: the same tuner, tuning key and timing
cache, with the vendor as the baseline a winner must beat head-to-head.

The key holds everything the timing depends on: the input and weight shapes, the geometry with the
pads made explicit (auto_pad resolved), the group, the fused activation with its parameters,
whether a bias and a residual (FusedConv's Z) are read, and the elementwise step infc's executor
would run as the convolution's epilogue (kernels/conv_epilogue.py). With such a step, the
candidates are what each tactic really runs: infc's ConvEpilogue (one pass), or onnxruntime's
convolution followed by the elementwise step (a second pass over the output).

A bf16 plan's convolution whose operands hold bf16 values (bf16_sites.py) is keyed as bfloat16 and,
where AMX-BF16 is usable, has one more candidate: infc's kernel on AMX tiles (TILES,
runtime/kernels/amx_conv.py), timed on an activation rounded to bf16 as the plan's is.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

from ..runtime import amx_gemm, vendor_op
from ..runtime.bf16_gemm import bf16_values
from ..runtime.kernels import conv as conv_kernels
from ..runtime.kernels import amx_conv, amx_taps, conv_taps, depthwise, im2col, jit_conv, kernel_for
from ..runtime.kernels.common import KernelContext, decode_attrs
from .config import Config
from .key import TuningKey, vendor_source_hash
from .tuner import Problem

OP = "Conv"
VENDOR = Config(vendor_op.TACTIC)
NATIVE = Config(vendor_op.NATIVE)
TILES = Config.of(vendor_op.NATIVE, tiles="amx-bf16")  # infc's kernel with the step's `bf16_tiles`
# onnxruntime on one thread: no hand-off to its pool's worker, which costs tens of microseconds a
# call when the worker sleeps (sessions do not spin, see vendor_op.py)
CANDIDATES = (VENDOR, Config.of(vendor_op.TACTIC, threads=1), NATIVE)
# the sources a timing holds for (with onnxruntime's version: key.vendor_source_hash)
KERNEL_SOURCES = (conv_kernels, conv_taps, depthwise, im2col, jit_conv, amx_conv, amx_taps, amx_gemm, vendor_op,
                  Path(__file__))
LAYOUTS = ("NCHW", "OIHW")


def epilogue_name(attrs: dict, has_bias: bool, has_residual: bool) -> str:
    activation = attrs.get("activation") or "none"
    params = attrs.get("activation_params")
    if params is not None and len(params):
        activation += "(" + ";".join(f"{float(p):g}" for p in np.asarray(params).ravel()) + ")"
    return activation + ("+bias" if has_bias else "") + ("+residual" if has_residual else "")


def then_name(reader: dict) -> str:
    """The epilogue step's ops, for the key (its scalars do not change the timing)."""
    ops = reader["attrs"]["ops"] if reader["op"] == "ElementwiseChain" else [{"op": reader["op"]}]
    return "+then=" + ".".join(op["op"] for op in ops)


def conv_key(x_shape: Sequence[int], w_shape: Sequence[int], attrs: dict, has_bias: bool, has_residual: bool,
             target: str, *, then: str = "", sources: str | None = None, dtype: str = "float32") -> TuningKey:
    """`dtype`: "bfloat16" for a convolution whose operands hold bf16 values (TILES competes)."""
    kernel = tuple(attrs.get("kernel_shape") or w_shape[2:])
    geo = conv_kernels.geometry(tuple(x_shape[2:]), kernel, attrs)
    spatial = len(x_shape) - 2
    shape = [("N", x_shape[0]), ("C", x_shape[1]), *((f"X{i}", x_shape[2 + i]) for i in range(spatial)),
             ("M", w_shape[0]), *((f"K{i}", kernel[i]) for i in range(spatial)),
             *((f"S{i}", geo.strides[i]) for i in range(spatial)), *((f"D{i}", geo.dilations[i]) for i in range(spatial)),
             *((f"PB{i}", geo.pads_begin[i]) for i in range(spatial)), *((f"PE{i}", geo.pads_end[i]) for i in range(spatial)),
             ("G", int(attrs.get("group", 1)))]
    return TuningKey(OP, tuple(shape), (dtype,) * 2, LAYOUTS, epilogue_name(attrs, has_bias, has_residual) + then,
                     target, sources or vendor_source_hash(*KERNEL_SOURCES))


def conv_problem(key: TuningKey, op: str, domain: str, attrs: dict, x_shape, w: np.ndarray, bias: np.ndarray | None,
                 residual_shape, opset: int, *, then: tuple[dict, dict, dict] | None = None, seed: int = 0) -> Problem:
    """The problem on seeded random activations (never zeros) and the step's own weights. `then`:
    (the epilogue step, the merged ConvEpilogue step, the weights its scalars come from). A key of
    dtype bfloat16 times an activation holding bf16 values, with TILES among the candidates where
    AMX-BF16 is usable."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(np.float32)
    is_bf16 = key.dtypes[0] == "bfloat16"
    if is_bf16:
        x = bf16_values(x)
    z = None if residual_shape is None else rng.standard_normal(residual_shape).astype(np.float32)
    names = ["x", "w", "b" if bias is not None else "", "z" if z is not None else ""]
    while names and not names[-1]:
        names.pop()
    inputs = [x, w, bias, z][:len(names)]
    constants = {"w": w, **({"b": bias} if bias is not None else {})}
    kernel = kernel_for(domain, op)
    after = _Epilogue(then, opset) if then else None

    def build(config: Config):
        run = _build(config)
        run.config = config  # lets a test's benchmark tell the candidates apart
        return run

    def _build(config: Config):
        if config.impl == vendor_op.TACTIC:
            run = vendor_op.vendor_runner(op, domain, attrs, names, constants, threads=config.param("threads"))
            if after is None:
                return lambda: run(inputs, attrs, None)[0]
            return lambda: after.separate(run(inputs, attrs, None)[0])
        tiles = config == TILES
        if after is not None:
            return after.fused(inputs, tiles)
        ctx = KernelContext(opset, [None], bf16_tiles=tiles)
        return lambda: kernel(inputs, attrs, ctx)[0]

    def reference() -> np.ndarray:
        wide = [None if a is None else a.astype(np.float64) for a in inputs]
        y = np.asarray(kernel(wide, attrs, KernelContext(opset, [None]))[0], dtype=np.float64)
        return y if after is None else np.asarray(after.separate(y, np.float64), dtype=np.float64)

    tiles = is_bf16 and amx_gemm.has_amx_bf16() and amx_conv.applies(x_shape, w.shape, int(attrs.get("group", 1)))
    candidates = CANDIDATES + ((TILES,) if tiles else ())
    return Problem(key, VENDOR, candidates, build, reference, out_dtype="float32")


class _Epilogue:
    """The elementwise step after a convolution: run on its own (after onnxruntime's convolution), or
    merged into infc's ConvEpilogue."""

    def __init__(self, then: tuple[dict, dict, dict], opset: int):
        self.reader, self.merged, self.weights = then
        self.opset = opset
        conv_outputs = set(self.reader["inputs"]) - set(self.weights)
        self.conv_out = next(iter(conv_outputs))

    def separate(self, y: np.ndarray, dtype=np.float32) -> np.ndarray:
        reader = self.reader
        args = [y if name == self.conv_out else (None if not name else self.weights[name].astype(dtype))
                for name in reader["inputs"]]
        kernel = kernel_for(reader.get("domain") or "", reader["op"])
        return kernel(args, decode_attrs(reader.get("attrs") or {}), KernelContext(self.opset, [None]))[0]

    def fused(self, conv_inputs: list, tiles: bool = False):
        merged = self.merged
        scalars = [self.weights[name] for name in merged["inputs"][4:]]
        args = list(conv_inputs) + [None] * (4 - len(conv_inputs)) + scalars
        kernel = kernel_for(merged["domain"], merged["op"])
        attrs = decode_attrs(merged["attrs"])
        ctx = KernelContext(self.opset, [None], bf16_tiles=tiles)
        return lambda: kernel(args, attrs, ctx)[0]


def macs(w_shape, out_shape) -> int:
    """Multiply-adds of a convolution: every output element takes one weight row (C/group x kernel)."""
    return math.prod(int(d) for d in out_shape) * math.prod(int(d) for d in w_shape[1:])
