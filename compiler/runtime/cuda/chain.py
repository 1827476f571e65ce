"""Launching a generated elementwise-chain kernel (compiler/codegen/chain_kernel.py) from a plan.

`function` follows CuPy's RawKernel convention, fn(grid, block, args): a Function of a module loaded
from the plan's cubin on a GPU, the CPU emulator's codegen.emulate.Function in CI. The layout (output
dims, then each input's broadcast strides) is computed on the host once per set of input shapes and
kept on the device, so a run costs one launch per chain.
"""

from __future__ import annotations

import math

import numpy as np

BLOCK = 256
BLOCKS_PER_SM = 16  # grid-stride loop: enough resident blocks to hide latency, no more


def chain_layout(input_shapes: list[tuple], out_shape: tuple) -> np.ndarray:
    """int64 [dims..., strides of input 0..., strides of input 1..., ...]: strides in elements of each
    C-contiguous input aligned to the output's last axes, 0 where the input broadcasts."""
    rank = len(out_shape)
    rows = [list(out_shape)]
    for shape in input_shapes:
        padded = (1,) * (rank - len(shape)) + tuple(shape)
        strides, step = [0] * rank, 1
        for axis in range(rank - 1, -1, -1):
            strides[axis] = 0 if padded[axis] == 1 else step
            step *= padded[axis]
        rows.append(strides)
    return np.asarray([v for row in rows for v in row] or [0], dtype=np.int64)


class ChainRunner:
    def __init__(self, function, num_inputs: int, num_sms: int = 132):
        self.function, self.num_inputs, self.num_sms = function, num_inputs, num_sms
        self.launches = 0

    def may_run(self, inputs) -> bool:
        return len(inputs) == self.num_inputs and all(x is not None and x.dtype == np.float32 for x in inputs)

    def __call__(self, inputs, ctx):
        xp = ctx.xp
        shapes = tuple(tuple(x.shape) for x in inputs)
        key = ("chain_layout", shapes)
        if key not in ctx.memo:
            out_shape = np.broadcast_shapes(*shapes)
            ctx.memo[key] = (out_shape, xp.asarray(chain_layout(list(shapes), out_shape)))
        out_shape, layout = ctx.memo[key]
        out = xp.empty(out_shape, dtype=np.float32)
        n = math.prod(out_shape)
        if n:
            grid = (max(1, min(-(-n // BLOCK), self.num_sms * BLOCKS_PER_SM)),)
            args = [xp.ascontiguousarray(x) for x in inputs] + [out, layout, np.int64(n), np.int32(len(out_shape))]
            self.function(grid, (BLOCK,), args)
            self.launches += 1
        return out
