"""Compiled (numba, see runtime/jit.py) elementwise chains (chain.py) of exactly rounded ops: Add,
Sub, Mul, Div, Neg, Abs, Relu, Sqrt, LeakyRelu. A chain of two adds on a [2, 16, 64] tensor is ~10
NumPy calls and Python bookkeeping; here it is one call.

Each op is one IEEE operation per element (LeakyRelu: a product and a compare), so the results are
bitwise those of the NumPy path whichever path runs: no contraction can happen across ops, which
write their results to scratch rows. Chains with other ops (transcendental ones, fused affine forms
such as HardSigmoid, Clip with operand bounds) keep the NumPy path.

Operands are C-contiguous and either cover the output, are one value, or repeat along the leading
axes (their shape without leading ones is a suffix of the output's: a bias [64] or a position
table [1, 16, 64] over [2, 16, 64]). The output runs in blocks whose length divides every
operand's period, so a block reads each operand as one contiguous run.
"""

# ruff: noqa: FURB136 - min()/max() would not keep a NaN (the compares do)

from __future__ import annotations

import math

import numpy as np

from ..gemm_impls import PARALLEL_MIN_BYTES
from ..jit import jit
from .common import parallel_for

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
ADD, SUB, MUL, DIV, NEG, ABS, RELU, SQRT, LEAKY_RELU = range(9)
OPCODES = {"Add": ADD, "Sub": SUB, "Mul": MUL, "Div": DIV, "Neg": NEG, "Abs": ABS, "Relu": RELU, "Sqrt": SQRT,
           "LeakyRelu": LEAKY_RELU}
MAX_BLOCK = 4096  # elements per block: the scratch rows stay in L1/L2
MAX_OPERANDS = 4
_UNUSED = {dtype: np.empty(1, dtype) for dtype in FLOATS}


@jit
def _run_blocks(a0, a1, a2, a3, periods, scalar_rows, code, params, block, num_rows, out, first, last):
    """Blocks [first, last) of the flat output. a0..a3: the flat inputs (separate arguments, not a
    tuple: weights are read-only arrays, feeds are not, and numba types the two apart; unused ones
    are stand-ins); periods[k]: element i of the output reads operand k at i % period, 0 for a
    single value (held in scratch row scalar_rows[k]);
    code[op] = (opcode, a, b, destination): a, b >= 0 an operand, < 0 the scratch row -1 - a;
    destination -1 is the output, else a scratch row; params[op]: LeakyRelu's alpha."""
    scratch = np.empty((num_rows, block), out.dtype)
    zero = out.dtype.type(0)
    for k in range(periods.shape[0]):
        if periods[k] == 0:
            value = a0[0] if k == 0 else a1[0] if k == 1 else a2[0] if k == 2 else a3[0]
            row = scratch[scalar_rows[k]]
            for e in range(block):
                row[e] = value
    for index in range(first, last):
        offset = index * block
        for op in range(code.shape[0]):
            opcode, a, b, destination = code[op, 0], code[op, 1], code[op, 2], code[op, 3]
            if a < 0:
                left = scratch[-1 - a]
            elif periods[a] == 0:
                left = scratch[scalar_rows[a]]
            else:
                start = offset % periods[a]
                left = (a0 if a == 0 else a1 if a == 1 else a2 if a == 2 else a3)[start:start + block]
            if b < 0:
                right = scratch[-1 - b]
            elif periods[b] == 0:
                right = scratch[scalar_rows[b]]
            else:
                start = offset % periods[b]
                right = (a0 if b == 0 else a1 if b == 1 else a2 if b == 2 else a3)[start:start + block]
            target = out[offset:offset + block] if destination < 0 else scratch[destination]
            if opcode == ADD:
                for e in range(block):
                    target[e] = left[e] + right[e]
            elif opcode == SUB:
                for e in range(block):
                    target[e] = left[e] - right[e]
            elif opcode == MUL:
                for e in range(block):
                    target[e] = left[e] * right[e]
            elif opcode == DIV:
                for e in range(block):
                    target[e] = left[e] / right[e]
            elif opcode == NEG:
                for e in range(block):
                    target[e] = -left[e]
            elif opcode == ABS:
                for e in range(block):
                    target[e] = abs(left[e])
            elif opcode == RELU:  # as np.maximum(x, 0): NaN and -0.0 pass through
                for e in range(block):
                    v = left[e]
                    target[e] = zero if v < zero else v
            elif opcode == SQRT:
                for e in range(block):
                    target[e] = np.sqrt(left[e])
            else:  # LEAKY_RELU, 0 <= alpha <= 1: np.maximum(x, alpha * x)
                alpha = out.dtype.type(params[op])
                for e in range(block):
                    v = left[e]
                    scaled = v * alpha
                    target[e] = scaled if scaled > v else v


class CompiledChain:
    """One chain at one set of input shapes, encoded for `_run_blocks`; `prepare` returns None for
    chains and operands it does not take."""

    __slots__ = ("encoded", "num_blocks")

    @classmethod
    def prepare(cls, ops, input_shapes, shape: tuple, dtype) -> CompiledChain | None:
        if dtype not in FLOATS or not shape or math.prod(shape) == 0:
            return None
        for op in ops:
            opcode = OPCODES.get(op["op"]) if (op.get("domain") or "") == "" else None
            args = op["args"]
            if opcode is None or len(args) != (2 if opcode <= DIV else 1) or any(a is None for a in args):
                return None
            if opcode == LEAKY_RELU and not 0 <= (op.get("attrs") or {}).get("alpha", 0.01) <= 1:
                return None
        if len(input_shapes) > MAX_OPERANDS:
            return None
        periods = [None if s is None else _period(s, shape) for s in input_shapes]
        if any(p is None for p in periods):
            return None
        # op k's result lives in scratch row k (chains are short), which its readers' argument
        # -1 - k names already; one row per single-value operand follows
        num_results = len(ops) - 1
        scalar_rows = np.full(len(periods), -1, np.int64)
        for k in [k for k, p in enumerate(periods) if p == 0]:
            scalar_rows[k] = num_results + int((scalar_rows >= 0).sum())
        num_rows = max(1, num_results + int((scalar_rows >= 0).sum()))
        code = np.array([[OPCODES[op["op"]], op["args"][0], op["args"][-1], -1 if k == num_results else k]
                         for k, op in enumerate(ops)], np.int64)
        params = np.array([(op.get("attrs") or {}).get("alpha", 0.01) for op in ops], np.float64)
        total = math.prod(shape)
        block = _block(shape, [p for p in periods if p > 0] or [total])
        chain = cls()
        chain.encoded = (np.array(periods, np.int64), scalar_rows, code, params, block, num_rows)
        chain.num_blocks = total // block
        return chain

    def run(self, inputs, out: np.ndarray) -> bool:
        """Writes the chain's result into out (C-contiguous, the output's shape); False (nothing
        written) when compiled kernels are off."""
        kernel = _run_blocks.get()
        if kernel is None:
            return False
        flat = [x.reshape(-1) for x in inputs]  # a strided operand is copied
        while len(flat) < MAX_OPERANDS:
            flat.append(_UNUSED[out.dtype])
        target = out.reshape(-1)
        periods, scalar_rows, code, params, block, num_rows = self.encoded
        if self.num_blocks >= 2 and target.nbytes >= PARALLEL_MIN_BYTES:
            half = self.num_blocks // 2
            parallel_for(2, lambda i: kernel(*flat, periods, scalar_rows, code, params, block, num_rows, target,
                                             0 if i == 0 else half, half if i == 0 else self.num_blocks))
        else:
            kernel(flat[0], flat[1], flat[2], flat[3], periods, scalar_rows, code, params, block, num_rows, target, 0,
                   self.num_blocks)
        return True


def _period(input_shape: tuple, shape: tuple) -> int | None:
    """0 for a single value; the operand's size when its shape without leading ones is a suffix of
    the output's (it repeats along the leading axes); None otherwise."""
    size = math.prod(input_shape)
    if size == 1:
        return 0
    stripped = tuple(input_shape)
    while stripped and stripped[0] == 1:
        stripped = stripped[1:]
    if len(stripped) > len(shape) or tuple(shape[len(shape) - len(stripped):]) != stripped:
        return None
    return size


def _block(shape: tuple, periods: list[int]) -> int:
    """The block length: the smallest period (every period is a product of trailing output dims,
    so it divides the others), cut to a shorter trailing product when above MAX_BLOCK."""
    smallest = min(periods)
    block = shape[-1]
    for dim in reversed(shape[:-1]):
        if block * dim > min(smallest, MAX_BLOCK) or smallest % (block * dim):
            break
        block *= dim
    return block if smallest % block == 0 else smallest
