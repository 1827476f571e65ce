"""An order of a program's steps that keeps the steps of one kind together.

Lowering orders steps as the graph's toposort lists them, which interleaves independent branches:
in Depth Anything the backbone's next layer sits between the neck's convolutions, so the steps
marked for onnxruntime fall into many short runs, each its own session that wakes its own thread
pool and hands its values back to the executor. Any topological order computes the same values, so
the in-context check (tune_context.py) runs its variants in one that takes, among the steps whose
inputs are ready, one of the kind it just ran for as long as there is one, else the earliest of
the other kind: a kind changes only when nothing of it is ready.
"""

from __future__ import annotations

import heapq


def clustered_order(steps: list[dict], is_kind) -> list[int]:
    """Indices of `steps` in a dependency-respecting order that runs steps with equal `is_kind(index)`
    back to back where it can; the steps' own order where they are all of one kind, or where a
    value is written by two steps (a program the order must not touch)."""
    kinds = [bool(is_kind(index)) for index in range(len(steps))]
    producer: dict[str, int] = {}
    for index, step in enumerate(steps):
        for name in step["outputs"]:
            if name and name in producer:
                return list(range(len(steps)))
            if name:
                producer[name] = index
    if len(set(kinds)) < 2:
        return list(range(len(steps)))
    readers: list[list[int]] = [[] for _ in steps]
    waiting = [0] * len(steps)
    for index, step in enumerate(steps):
        for source in {producer[name] for name in step["inputs"] if name in producer and producer[name] != index}:
            readers[source].append(index)
            waiting[index] += 1
    ready = {True: [], False: []}
    for index in range(len(steps)):
        if not waiting[index]:
            heapq.heappush(ready[kinds[index]], index)
    order, kind = [], kinds[0]
    while ready[True] or ready[False]:
        if not ready[kind]:
            kind = not kind
        index = heapq.heappop(ready[kind])
        order.append(index)
        for reader in readers[index]:
            waiting[reader] -= 1
            if not waiting[reader]:
                heapq.heappush(ready[kinds[reader]], reader)
    return order if len(order) == len(steps) else list(range(len(steps)))
