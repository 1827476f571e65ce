"""The memory plan: activations packed into one arena by liveness.

Sizes come from a sample run at the profile's max shapes (the build records every value's shape).
Values live from the step that produces them to their last use (graph outputs to the end); two
values may share bytes when their lifetimes do not overlap. Placement is greedy best-fit by size,
largest first, which is simple and usually within a few percent of optimal.
"""

from __future__ import annotations

from dataclasses import dataclass

ALIGNMENT = 64


@dataclass
class MemoryPlan:
    offsets: dict[str, int]
    sizes: dict[str, int]
    arena_bytes: int
    sum_activation_bytes: int
    planned_for: dict[str, list[int]]

    def to_json(self) -> dict:
        return {"arena_bytes": self.arena_bytes, "sum_activation_bytes": self.sum_activation_bytes,
                "offsets": self.offsets, "sizes": self.sizes, "planned_for": self.planned_for}

    @classmethod
    def from_json(cls, data: dict) -> "MemoryPlan":
        return cls(data["offsets"], data["sizes"], data["arena_bytes"], data["sum_activation_bytes"], data["planned_for"])


def _aligned(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def lifetimes(steps: list[dict], outputs: list[str]) -> dict[str, tuple[int, int]]:
    """Value -> (producing step, last consuming step) for values produced by the program."""
    born, last = {}, {}
    for index, step in enumerate(steps):
        for name in step["inputs"]:
            if name in born:
                last[name] = index
        for name in step["outputs"]:
            if name:
                born[name] = index
                last.setdefault(name, index)
    end = len(steps)
    for name in outputs:
        if name in born:
            last[name] = end
    return {name: (born[name], last[name]) for name in born}


def plan_memory(steps: list[dict], outputs: list[str], sizes: dict[str, int], planned_for: dict[str, list[int]]) -> MemoryPlan:
    spans = lifetimes(steps, outputs)
    order = sorted((n for n in spans if n in sizes), key=lambda n: (-sizes[n], spans[n][0], n))
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, born, dies)
    offsets = {}
    for name in order:
        size = _aligned(max(sizes[name], 1))
        born, dies = spans[name]
        busy = sorted((o, e) for o, e, b, d in placed if not (d < born or dies < b))
        offset = 0
        for start, stop in busy:
            if offset + size <= start:
                break
            offset = max(offset, _aligned(stop))
        offsets[name] = offset
        placed.append((offset, offset + size, born, dies))
    arena = max((end for _, end, _, _ in placed), default=0)
    return MemoryPlan(offsets, {n: sizes[n] for n in order}, arena, sum(sizes[n] for n in order), planned_for)
