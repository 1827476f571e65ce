"""`infc.cpu.ConvEpilogue`: a Conv / com.microsoft.FusedConv whose only reader is an elementwise
step with scalar operands (one op, or an ElementwiseChain: HardSwish, x * sigmoid(b * x), learned
affine activations...). The elementwise ops run on each block of the convolution's output right
after the block is computed, while it is in cache, instead of as one more pass over memory:

    x ─► Conv ─► c ─► ElementwiseChain(c, s1, s2) ─► y      ══►    x ─► ConvEpilogue(x, w, b, z, s1, s2) ─► y

inputs: [x, w, bias or "", z or "", *scalars]; attrs: the convolution's (with FusedConv's
activation, which runs first) and "epilogue": ops in ElementwiseChain's format (chain.py) where
arg 0 is the convolution's result and arg k >= 1 the scalar k - 1.

The CPU executor fuses these at load (`fuse_conv_epilogues`), so plans stay portable: a device
executor, or a build that observes every value, sees the original steps.
"""

from __future__ import annotations

import numpy as np

from .chain import INTO, compile_ops, run_program
from .common import KernelContext
from .conv import fused_conv
from .im2col import pooled

OP, DOMAIN = "ConvEpilogue", "infc.cpu"
CONVS = {("", "Conv"), ("com.microsoft", "FusedConv")}
CHAIN = ("infc.cpu", "ElementwiseChain")
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def conv_epilogue(inputs, attrs, ctx: KernelContext):
    compiled = ctx.memo.get("epilogue")
    if compiled is None:
        compiled = ctx.memo["epilogue"] = compile_ops(attrs["epilogue"])
    program, num_registers = compiled
    scalars = tuple(s.reshape(()) for s in inputs[4:])  # 0-d: a block keeps its own rank

    def then(block):
        size = block.size
        registers = [pooled(f"epilogue{i}", size, block.dtype)[:size].reshape(block.shape)
                     for i in range(num_registers + 1)]  # + the spare
        run_program(program, (block,) + scalars, block, registers)

    if inputs[0].dtype not in FLOATS:
        return _unfused(inputs, attrs, ctx)
    return fused_conv(inputs[:4], attrs, ctx, then)


def _unfused(inputs, attrs, ctx):
    y = fused_conv(inputs[:4], attrs, ctx)[0]
    from . import kernel_for  # noqa: PLC0415 - the registry imports this module

    results = []
    for op in attrs["epilogue"]:
        args = [None if a is None else (y if a == 0 else inputs[3 + a]) if a >= 0 else results[-1 - a] for a in op["args"]]
        kernel = kernel_for(op.get("domain") or "", op["op"])
        results.append(kernel(args, op.get("attrs") or {}, KernelContext(ctx.opset, [None]))[0])
    return [results[-1]]


def fuse_conv_epilogues(steps: list[dict], weights: dict, keep: set[str]) -> list[dict]:
    """The program with each convolution whose output only one scalar-operand elementwise step reads
    (and that is not in `keep`) merged with that step."""
    readers: dict[str, list[int]] = {}
    for index, step in enumerate(steps):
        for name in step["inputs"]:
            if name:
                readers.setdefault(name, []).append(index)
    merged: dict[int, dict] = {}
    for index, step in enumerate(steps):
        key = (step.get("domain") or "", step["op"])
        if key not in CONVS or len(step["outputs"]) != 1 or step["outputs"][0] in keep:
            continue
        out = step["outputs"][0]
        if len(readers.get(out, [])) != 1 or readers[out][0] in merged:
            continue
        reader = readers[out][0]
        fused = _merge(step, steps[reader], out, weights)
        if fused is not None:  # runs where the convolution ran: its reader's other inputs are weights
            merged[index] = fused
            merged[reader] = None
    return [merged.get(i, step) for i, step in enumerate(steps) if merged.get(i, step) is not None]


def _merge(conv: dict, reader: dict, out: str, weights: dict) -> dict | None:
    key = (reader.get("domain") or "", reader["op"])
    if key == CHAIN:
        ops = reader["attrs"]["ops"]
    elif key in INTO and len(reader["outputs"]) == 1:
        ops = [{"op": reader["op"], "domain": key[0], "args": list(range(len(reader["inputs"]))),
                "attrs": dict(reader.get("attrs") or {})}]
    else:
        return None
    if reader["op"] == "LeakyRelu" and not 0 <= (reader.get("attrs") or {}).get("alpha", 0.01) <= 1:
        return None  # chain.py's LeakyRelu is the max form, right for alphas in [0, 1] only
    scalars = []
    for name in reader["inputs"]:
        if name and name != out:
            value = weights.get(name)
            if value is None or value.size != 1:
                return None
            if name not in scalars:
                scalars.append(name)
    slot = {out: 0, **{name: 1 + k for k, name in enumerate(scalars)}}
    remapped = [dict(op, args=[a if a is None or a < 0 else (slot[reader["inputs"][a]] if reader["inputs"][a] else None)
                               for a in op["args"]]) for op in ops]
    inputs = list(conv["inputs"]) + [""] * (4 - len(conv["inputs"]))
    return {"op": OP, "domain": DOMAIN, "name": f"{conv.get('name', '')}+{reader.get('name', '')}",
            "inputs": inputs + scalars, "outputs": list(reader["outputs"]),
            "attrs": dict(conv.get("attrs") or {}, epilogue=remapped)}


KERNELS = {(DOMAIN, OP): conv_epilogue}
