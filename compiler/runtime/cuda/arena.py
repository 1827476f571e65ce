"""The device arena: one allocation holding the outputs the executor writes through `out=` (GEMM
sites), at offsets from a liveness plan at the profile's max shapes. Other values come from the
array module's pool (CuPy caches its blocks: no cudaMalloc per run after the first).

Views make lifetimes longer than names say: a Reshape or Transpose of a GEMM output reads the same
bytes, so the plan runs over the program with each view renamed to the array it views; bytes are
reused only when no view of them is alive.
"""

from __future__ import annotations

import numpy as np

from ...memory_plan import MemoryPlan, plan_memory


def alias_roots(steps: list[dict], view_ops) -> dict[str, str]:
    """Value -> the value whose memory it may share (itself when it owns its memory)."""
    root: dict[str, str] = {}
    for step in steps:
        if ((step.get("domain") or ""), step["op"]) in view_ops and step["inputs"] and step["inputs"][0]:
            origin = root.get(step["inputs"][0], step["inputs"][0])
            for name in step["outputs"]:
                if name:
                    root[name] = origin
    return root


def plan_arena(steps: list[dict], output_names: list[str], sizes: dict[str, int], view_ops) -> MemoryPlan:
    root = alias_roots(steps, view_ops)
    renamed = [{"inputs": [root.get(n, n) for n in s["inputs"]],
                "outputs": [n if n not in root else "" for n in s["outputs"]]} for s in steps]
    return plan_memory(renamed, [root.get(n, n) for n in output_names], sizes, {})


class Arena:
    def __init__(self, plan: MemoryPlan, xp):
        self.plan, self.xp = plan, xp
        self.buffer = xp.empty(max(plan.arena_bytes, 1), dtype=xp.uint8)
        self.num_fresh = 0  # requests larger than planned (shapes outside the profile)

    def alloc_for(self, name: str):
        offset, size = self.plan.offsets.get(name), self.plan.sizes.get(name, 0)

        def alloc(shape, dtype):
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            if offset is None or nbytes > size:
                self.num_fresh += 1
                return self.xp.empty(shape, dtype=dtype)
            return self.buffer[offset:offset + nbytes].view(dtype).reshape(shape)
        return alloc
