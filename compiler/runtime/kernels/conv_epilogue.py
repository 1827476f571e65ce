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

import math

import numpy as np

from . import jit_conv
from .chain import EPILOGUE_ONLY, INTO, compile_ops, run_program
from .common import KernelContext
from .conv import fused_conv
from .im2col import pooled
from .jit_conv import FusedActivation

OP, DOMAIN = "ConvEpilogue", "infc.cpu"
CONVS = {("", "Conv"), ("com.microsoft", "FusedConv")}
CHAIN = ("infc.cpu", "ElementwiseChain")
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
EPILOGUE_OPS = {**INTO, **EPILOGUE_ONLY}


def conv_epilogue(inputs, attrs, ctx: KernelContext):
    compiled = ctx.memo.get("epilogue")
    if compiled is None:
        compiled = ctx.memo["epilogue"] = compile_ops(attrs["epilogue"], EPILOGUE_OPS)
    program, num_registers = compiled
    scalars = tuple(s.reshape(()) for s in inputs[4:])  # 0-d: a block keeps its own rank

    def then(block):
        size = block.size
        registers = [pooled(f"epilogue{i}", size, block.dtype)[:size].reshape(block.shape)
                     for i in range(num_registers + 1)]  # + the spare
        run_program(program, (block,) + scalars, block, registers)

    if inputs[0].dtype not in FLOATS:
        return _unfused(inputs, attrs, ctx)
    return fused_conv(inputs[:4], attrs, ctx, _as_fused_activation(attrs["epilogue"], inputs[4:], then, ctx.memo))


def _as_fused_activation(ops, scalars, then, memo: dict):
    """`then` as a jit_conv.FusedActivation when the program is one activation the compiled
    kernels apply themselves, maybe followed by a scalar affine (see _known_activation), else
    `then` itself. Kept in the memo while the same scalar arrays come back."""
    cached = memo.get("fused-activation")
    if cached is not None and len(cached[0]) == len(scalars) and all(a is b for a, b in zip(cached[0], scalars)):
        return cached[1] or then
    known = _known_activation(ops, scalars)
    fused = None if known is None else FusedActivation(known[0], known[1], then, known[2])
    memo["fused-activation"] = (tuple(scalars), fused)
    return fused or then


def _known_activation(ops, scalars) -> tuple[int, tuple, tuple | None] | None:
    """(code, params, affine) when `ops` (ElementwiseChain form, arg 0 the convolution's result,
    arg k >= 1 scalar k - 1, arg -1 - i the result of op i) is one activation of the convolution's
    result (HardSwish, as one op or as HardSigmoid then Mul; Relu; HardSigmoid; LeakyRelu; Clip
    with constant bounds; SiLU as com.microsoft.QuickGelu; or none), then any run of Mul / Add by scalars (PP-OCR's learned affine
    after HardSwish): affine = (scale, shift), or None when there is no such run."""
    names = [(op.get("domain") or "", op["op"]) for op in ops]
    if names[:2] == [("", "HardSigmoid"), ("", "Mul")] and list(ops[0]["args"]) == [0] and \
            sorted(ops[1]["args"]) == [-1, 0]:
        attrs = ops[0].get("attrs") or {}
        code, params, used = jit_conv.HARD_SWISH, (attrs.get("alpha", 0.2), attrs.get("beta", 0.5)), 2
    else:
        single = _single_activation(ops[0], scalars) if ops else None
        code, params, used = (jit_conv.IDENTITY, (0.0, 0.0), 0) if single is None else (*single, 1)
    affine = _scalar_affine(ops[used:], used, scalars)
    if affine is None or (used == 0 and affine is False):
        return None
    return code, params, affine or None


def _single_activation(op, scalars) -> tuple[int, tuple] | None:
    name, attrs, args = op["op"], op.get("attrs") or {}, list(op["args"])
    if (op.get("domain"), name) == ("com.microsoft", "QuickGelu") and args == [0]:  # SiLU (fuse/silu.py)
        return jit_conv.SILU, (0.5 * attrs.get("alpha", 1.702), 0.5)
    if op.get("domain") or args[:1] != [0]:
        return None
    rest = args[1:]
    if name == "Clip":  # bounds: attributes (opset < 11) or scalar inputs
        if len(rest) > 2 or any(a is not None and a < 1 for a in rest):
            return None
        low, high = [None if a is None else float(scalars[a - 1].reshape(())) for a in (rest + [None, None])[:2]] \
            if rest else (attrs.get("min"), attrs.get("max"))
        return jit_conv.CLIP, (-math.inf if low is None else low, math.inf if high is None else high)
    if rest:
        return None
    if name == "HardSigmoid":
        return jit_conv.HARD_SIGMOID, (attrs.get("alpha", 0.2), attrs.get("beta", 0.5))
    if name == "LeakyRelu":
        alpha = attrs.get("alpha", 0.01)
        return (jit_conv.LEAKY_RELU, (alpha, 0.0)) if 0 <= alpha <= 1 else None
    return {"Relu": (jit_conv.RELU, (0.0, 0.0)), "HardSwish": (jit_conv.HARD_SWISH, (1 / 6, 0.5))}.get(name)


def _scalar_affine(ops, first: int, scalars):
    """(scale, shift) for ops that each multiply or add the previous result (op first - 1, or the
    convolution's result when first is 0) by a scalar; False when there are none, None when some
    op is anything else."""
    if not ops:
        return False
    scale, shift = 1.0, 0.0
    for index, op in enumerate(ops, start=first):
        previous = -index if index else 0
        args = list(op["args"])
        if op.get("domain") or op["op"] not in ("Mul", "Add") or len(args) != 2 or previous not in args:
            return None
        other = args[1] if args[0] == previous else args[0]
        if other is None or other < 1:
            return None
        value = float(scalars[other - 1].reshape(()))
        scale, shift = (scale * value, shift * value) if op["op"] == "Mul" else (scale, shift + value)
    return scale, shift


def _unfused(inputs, attrs, ctx):
    y = fused_conv(inputs[:4], attrs, ctx)[0]
    from . import kernel_for  # here: the registry imports this module

    results = []
    for op in attrs["epilogue"]:
        args = [None if a is None else (y if a == 0 else inputs[3 + a]) if a >= 0 else results[-1 - a] for a in op["args"]]
        kernel = kernel_for(op.get("domain") or "", op["op"])
        results.append(kernel(args, op.get("attrs") or {}, KernelContext(ctx.opset, [None]))[0])
    return [results[-1]]


def fuse_conv_epilogues(steps: list[dict], weights: dict, keep: set[str]) -> list[dict]:
    """The program with each convolution whose output only one scalar-operand elementwise step reads
    (and that is not in `keep`) merged with that step."""
    merged: dict[int, dict | None] = {}
    for index, (reader, fused) in epilogue_pairs(steps, weights, keep).items():
        merged[index] = fused
        merged[reader] = None
    return [merged.get(i, step) for i, step in enumerate(steps) if merged.get(i, step) is not None]


def epilogue_pairs(steps: list[dict], weights: dict, keep: set[str]) -> dict[int, tuple[int, dict]]:
    """conv step index -> (its reader's index, the merged ConvEpilogue step), for each pair
    fuse_conv_epilogues merges (the build's conv tuning times a convolution with its epilogue)."""
    readers: dict[str, list[int]] = {}
    for index, step in enumerate(steps):
        for name in step["inputs"]:
            if name:
                readers.setdefault(name, []).append(index)
    pairs: dict[int, tuple[int, dict]] = {}
    taken: set[int] = set()
    for index, step in enumerate(steps):
        key = (step.get("domain") or "", step["op"])
        if key not in CONVS or len(step["outputs"]) != 1 or step["outputs"][0] in keep or step.get("tactic"):
            continue  # a convolution onnxruntime runs (runtime/vendor_op.py) has no epilogue hook
        out = step["outputs"][0]
        if len(readers.get(out, [])) != 1 or readers[out][0] in taken:
            continue
        reader = readers[out][0]
        if steps[reader].get("tactic"):
            continue  # a bridge of an onnxruntime run (runtime/vendor_op.py): the run keeps it
        fused = _merge(step, steps[reader], out, weights)
        if fused is not None:  # runs where the convolution ran: its reader's other inputs are weights
            pairs[index] = (reader, fused)
            taken.add(reader)
    return pairs


def _merge(conv: dict, reader: dict, out: str, weights: dict) -> dict | None:
    key = (reader.get("domain") or "", reader["op"])
    if key == CHAIN:
        ops = reader["attrs"]["ops"]
    elif key in EPILOGUE_OPS and len(reader["outputs"]) == 1:
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
            "attrs": dict(conv.get("attrs") or {}, epilogue=remapped), **({"bf16_tiles": True} if conv.get("bf16_tiles") else {})}


KERNELS = {(DOMAIN, OP): conv_epilogue}
