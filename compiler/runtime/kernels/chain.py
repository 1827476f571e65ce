"""`infc.cpu.ElementwiseChain`: a run of elementwise steps fused at lowering (compiler/lower_fuse.py).

    attrs["ops"] = [{"op": "HardSigmoid", "domain": "", "args": [0], "attrs": {...}},
                    {"op": "Mul", "domain": "", "args": [0, -1], "attrs": {}}, ...]

args: an int >= 0 is the step's input at that index, an int < 0 the result of op number -1 - arg,
None an omitted optional input. The last op's result is the step's output.

Float32/float64 data runs chunk by chunk: a block of the output (CHUNK elements, split along the
leading axes so broadcast operands slice along) goes through every op while it is in cache, the
temporaries live in small scratch buffers kept between runs, and only the last op writes the output,
so memory is read and written once instead of once per op. (Chunks are not shared with the helper
thread: their many short NumPy calls mostly hold the GIL, and measured slower that way.) Chains of
exactly rounded ops (Add, Mul, Relu, ...) over contiguous operands run as one compiled call when
numba is there instead (jit_chain.py; bitwise the same results). The output is the buffer the executor
donates (an input that dies here, see executor.py) when it has the output's shape. Anything else
(integer data, operands that do not cover the output) runs op by op on the registered kernels.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from .common import KernelContext, broadcast_shape, clip_into
from .jit_chain import CompiledChain

CHUNK = 1 << 17  # elements per chunk (512 KB of float32): operands and temporaries stay in L2 (measured best)
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _binary(ufunc):
    def run(args, attrs, out, spare):
        ufunc(args[0], args[1], out=out)
    return run


def _unary(ufunc):
    def run(args, attrs, out, spare):
        ufunc(args[0], out=out)
    return run


def _relu(args, attrs, out, spare):
    np.maximum(args[0], 0, out=out)


def _sigmoid(args, attrs, out, spare):  # as activation.sigmoid: the tanh form
    np.multiply(args[0], 0.5, out=out)
    np.tanh(out, out=out)
    out *= 0.5
    out += 0.5


def _quick_gelu(args, attrs, out, spare):  # com.microsoft.QuickGelu: x * sigmoid(alpha x), SiLU at alpha 1
    np.multiply(args[0], attrs.get("alpha", 1.702) * 0.5, out=spare)
    np.tanh(spare, out=spare)
    spare *= 0.5
    spare += 0.5
    np.multiply(args[0], spare, out=out)


def _hard_sigmoid_into(x, alpha, beta, out):
    np.multiply(x, alpha, out=out)
    out += beta
    clip_into(out, 0.0, 1.0, out)


def _hard_sigmoid(args, attrs, out, spare):
    _hard_sigmoid_into(args[0], attrs.get("alpha", 0.2), attrs.get("beta", 0.5), out)


def _hard_swish(args, attrs, out, spare):
    _hard_sigmoid_into(args[0], 1 / 6, 0.5, spare)
    np.multiply(args[0], spare, out=out)


def _leaky_relu(args, attrs, out, spare):  # lowering only fuses 0 <= alpha <= 1
    np.multiply(args[0], attrs.get("alpha", 0.01), out=spare)
    np.maximum(args[0], spare, out=out)


def _clip(args, attrs, out, spare):
    low, high = (args[1] if len(args) > 1 else None), (args[2] if len(args) > 2 else None)
    if len(args) == 1:  # opset < 11: attributes
        low, high = attrs.get("min"), attrs.get("max")
    if low is None and high is None:
        np.copyto(out, args[0])
        return
    source = args[0]
    if low is not None:
        np.maximum(source, low, out=out)
        source = out
    if high is not None:
        np.minimum(source, high, out=out)


# (domain, op) -> run(args, attrs, out, spare): writes the result into `out`, which may be the memory
# of one of the args; `spare` is a scratch buffer of the same shape no arg lives in.
INTO = {
    ("", "Add"): _binary(np.add), ("", "Sub"): _binary(np.subtract), ("", "Mul"): _binary(np.multiply),
    ("", "Div"): _binary(np.divide),
    ("", "Relu"): _relu, ("", "Sigmoid"): _sigmoid, ("", "Tanh"): _unary(np.tanh), ("", "Neg"): _unary(np.negative),
    ("", "Abs"): _unary(np.abs), ("", "Exp"): _unary(np.exp), ("", "Sqrt"): _unary(np.sqrt),
    ("", "HardSigmoid"): _hard_sigmoid, ("", "HardSwish"): _hard_swish, ("", "LeakyRelu"): _leaky_relu,
    ("", "Clip"): _clip,
}
# Ops only a convolution epilogue runs (conv_epilogue.py), not lowering's chains: SiLU after a Conv
# has a compiled form inside the convolution kernels (jit_conv.SILU); a chain would lose the
# compiled QuickGelu and the device code generator has no form for it.
EPILOGUE_ONLY = {("com.microsoft", "QuickGelu"): _quick_gelu}


def compile_ops(ops, table=None) -> tuple[list, int]:
    """Per op (run, [(is_register, index)], attrs, destination register or -1 for the output), and
    the number of registers: a result's register is reused once its last reader has run. `table`:
    the ops' implementations (default INTO)."""
    table = INTO if table is None else table
    program = []
    registers, free, last_use = 0, [], {}
    for k, op in enumerate(ops):
        for a in op["args"]:
            if a is not None and a < 0:
                last_use[-1 - a] = k
    where = {}  # op result -> register
    for k, op in enumerate(ops):
        refs = [(False, -1) if a is None else (False, a) if a >= 0 else (True, where[-1 - a]) for a in op["args"]]
        for a in op["args"]:  # registers of results whose last use is this op are free for its result
            if a is not None and a < 0 and last_use[-1 - a] == k and where[-1 - a] not in free:
                free.append(where[-1 - a])
        if k == len(ops) - 1:
            destination = -1
        elif free:
            destination = free.pop()
        else:
            destination, registers = registers, registers + 1
        where[k] = destination
        program.append((table[(op.get("domain") or "", op["op"])], refs, op.get("attrs") or {}, destination))
    return program, registers


def run_program(program, operands, target, registers) -> None:
    """One block: every op in order, the last one writing `target` (which may be operands[0])."""
    spare = registers[-1]
    for run, refs, op_attrs, destination in program:
        args = [registers[i] if is_register else (operands[i] if i >= 0 else None) for is_register, i in refs]
        run(args, op_attrs, target if destination < 0 else registers[destination], spare)


class _Plan:
    """How one set of input shapes runs: the chunks, and per op its operands and destination."""

    def __init__(self, inputs, ops, dtype, shape):
        self.shape, self.dtype = shape, dtype
        self.program, registers = compile_ops(ops)
        self.chunks = list(_chunks(shape, [None if x is None else x.shape for x in inputs]))
        self.registers = registers + 1  # + the spare
        self._scratch: dict[int, dict] = {}  # thread -> chunk shape -> register views
        self.compiled = CompiledChain.prepare(ops, [None if x is None else x.shape for x in inputs], shape, dtype)

    def scratch(self, chunk_shape) -> list:
        """The registers for a chunk, per thread (two executors of one plan may run at once)."""
        views = self._scratch.get(threading.get_ident())
        if views is None:
            size = max(math.prod(c[1]) for c in self.chunks) if self.chunks else 0
            flat = [np.empty(size, self.dtype) for _ in range(self.registers)]
            views = self._scratch[threading.get_ident()] = {
                chunk: [f[:math.prod(chunk)].reshape(chunk) for f in flat] for chunk in {c[1] for c in self.chunks}}
        return views[chunk_shape]


def _chunks(shape, input_shapes):
    """(output index, chunk shape, per-input index or None): blocks of about CHUNK elements along
    the leading axes; an operand slices along the axes where it is not broadcast."""
    ndim = len(shape)
    if math.prod(shape) <= CHUNK or ndim == 0:
        yield None, shape, [None] * len(input_shapes)
        return
    axis = 0
    while axis < ndim - 1 and math.prod(shape[axis + 1:]) > CHUNK:
        axis += 1
    inner = math.prod(shape[axis + 1:])
    step = max(1, CHUNK // max(inner, 1))
    for lead in (np.ndindex(*shape[:axis]) if axis else [()]):
        for start in range(0, shape[axis], step):
            stop = min(start + step, shape[axis])
            index = tuple(lead) + (slice(start, stop),)
            per_input = []
            for s in input_shapes:
                if s is None:
                    per_input.append(None)
                    continue
                offset = ndim - len(s)
                parts = []
                for ax in range(max(offset, 0), axis + 1):
                    dim = s[ax - offset]
                    if ax < axis:
                        parts.append(lead[ax] if dim != 1 else 0)
                    else:
                        parts.append(slice(start, stop) if dim != 1 else slice(None))
                per_input.append(tuple(parts))
            yield index, (stop - start,) + tuple(shape[axis + 1:]), per_input


def _plan_for(inputs, ops, ctx) -> _Plan | None:
    key = tuple(None if x is None else (x.shape, x.dtype) for x in inputs)
    memo = ctx.memo if ctx is not None else {}
    plan = memo.get(key, False)
    if plan is not False:
        return plan
    plan = None
    dtypes = {x.dtype for x in inputs if x is not None}
    if len(dtypes) == 1 and next(iter(dtypes)) in FLOATS and all(
            (op.get("domain") or "", op["op"]) in INTO for op in ops):
        shape = ()
        for x in inputs:
            if x is not None:
                shape = broadcast_shape(shape, x.shape)
        # every op's result must have the output's shape: some operand is a result or a full input
        full = all(any(a is not None and (a < 0 or inputs[a].shape == shape) for a in op["args"]) for op in ops)
        if full:
            plan = _Plan(inputs, ops, next(iter(dtypes)), shape)
    if len(memo) > 16:
        memo.clear()
    memo[key] = plan
    return plan


def elementwise_chain(inputs, attrs, ctx):
    ops = attrs["ops"]
    plan = _plan_for(inputs, ops, ctx)
    if plan is None:
        return [_op_by_op(inputs, ops, ctx)]
    out = ctx.out[0] if ctx is not None and ctx.out else None
    if out is None or out.shape != plan.shape or out.dtype != plan.dtype or not out.flags.c_contiguous:
        out = np.empty(plan.shape, plan.dtype)
    if plan.compiled is not None and plan.compiled.run(inputs, out):
        return [out]
    program, chunks = plan.program, plan.chunks

    def chunk(number):
        index, chunk_shape, per_input = chunks[number]
        operands = [x if i is None or x is None else x[i] for x, i in zip(inputs, per_input)]
        run_program(program, operands, out if index is None else out[index], plan.scratch(chunk_shape))

    for number in range(len(chunks)):  # not shared with the helper thread: many short NumPy calls hold the GIL
        chunk(number)
    return [out]


elementwise_chain.accepts_out = True


def _op_by_op(inputs, ops, ctx):
    from . import kernel_for  # here, not at the top: the registry imports this module

    opset = ctx.opset if ctx is not None else 17
    results = []
    for op in ops:
        args = [None if a is None else inputs[a] if a >= 0 else results[-1 - a] for a in op["args"]]
        kernel = kernel_for(op.get("domain") or "", op["op"])
        results.append(kernel(args, op.get("attrs") or {}, KernelContext(opset, [None]))[0])
    return results[-1]


KERNELS = {("infc.cpu", "ElementwiseChain"): elementwise_chain}
