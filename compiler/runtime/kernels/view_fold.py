"""Load-time folding of layout steps that undo each other or chain, in a CPU program.

Why: a paged decoder's attention is wrapped in layout steps from two sources, the export's
[B, S, N, H] <-> [B, N, S, H] transposes and the paged op's own [1, T, N * H] form
(decoder/canonicalize.py), so every layer runs pairs that cancel:

    rotary(q) ─► Reshape(s1) ─► Transpose(0,2,1,3) ─► Transpose(0,2,1,3) ─► Reshape(s2) ─► PagedAttention
    PagedAttention ─► Reshape(s1) ─► Transpose(0,2,1,3) ─► Transpose(0,2,1,3) ─► Reshape(s2) ─► o_proj

Each is a view in NumPy, but a step costs the executor's loop a few microseconds; SmolLM2's decode
step ran 363 layout steps, 180 of them in these chains. Folded:

    rotary(q) ─► infc.cpu.ReshapeChain(s1, s2) ─► PagedAttention

- Transpose(p) then Transpose(p') whose composition is the identity, the middle value read by the
  second alone: both go, the second's readers read the first's input.
- Reshape then Reshape (the middle read by the second alone): one ReshapeChain of all the shapes,
  which reshapes to the last shape directly when it copies no dimension (no 0 without allowzero; a
  -1 resolves to the same extent, the element count being the same), else one Reshape after the
  other. The values are the same arrays' elements either way: nothing is computed.

Values a program must show (`keep`: its outputs) are never folded away. The plan keeps its steps;
only the CPU executor folds them, as it fuses its other load-time pairs (executor.py).
"""

from __future__ import annotations

from .shape import reshape

OP, DOMAIN = "ReshapeChain", "infc.cpu"
TRANSPOSE, RESHAPE = ("", "Transpose"), ("", "Reshape")


def _key(step: dict) -> tuple[str, str]:
    return (step.get("domain") or "", step["op"])


def _readers(steps: list[dict | None]) -> dict[str, list[int]]:
    readers: dict[str, list[int]] = {}
    for index, step in enumerate(steps):
        if step is not None:
            for name in step["inputs"]:
                if name:
                    readers.setdefault(name, []).append(index)
    return readers


def _cancels(first: dict, second: dict) -> bool:
    p, q = (first.get("attrs") or {}).get("perm"), (second.get("attrs") or {}).get("perm")
    if p is None or q is None or len(p) != len(q) or sorted(p) != list(range(len(p))):
        return False
    return [p[axis] for axis in q] == list(range(len(p)))


def _sole_reader(step: dict, readers: dict, keep: set[str]) -> int | None:
    """The index of the one step reading `step`'s single output, when nothing else may see it."""
    outputs = step["outputs"]
    if len(outputs) != 1 or not outputs[0] or outputs[0] in keep or step.get("tactic"):
        return None
    found = readers.get(outputs[0], [])
    return found[0] if len(found) == 1 else None


def _drop_transpose_pairs(steps: list[dict], keep: set[str]) -> list[dict]:
    steps = list(steps)
    readers = _readers(steps)
    renamed: dict[str, str] = {}
    for index, step in enumerate(steps):
        if step is None or _key(step) != TRANSPOSE:
            continue
        inner = _sole_reader(step, readers, keep)
        second = steps[inner] if inner is not None else None
        if second is None or _key(second) != TRANSPOSE or second.get("tactic") or not _cancels(step, second):
            continue
        if second["outputs"][0] in keep or second["inputs"][0] != step["outputs"][0]:
            continue
        source = renamed.get(step["inputs"][0], step["inputs"][0])
        renamed[second["outputs"][0]] = source
        steps[index] = steps[inner] = None
    out = []
    for step in steps:
        if step is not None:
            inputs = [renamed.get(name, name) for name in step["inputs"]]
            out.append(step if inputs == step["inputs"] else {**step, "inputs": inputs})
    return out


def _chain_reshapes(steps: list[dict], keep: set[str]) -> list[dict]:
    steps = list(steps)
    readers = _readers(steps)
    for index, step in enumerate(steps):
        if step is None or _key(step) not in (RESHAPE, (DOMAIN, OP)) or step.get("tactic"):
            continue
        inner = _sole_reader(step, readers, keep)
        second = steps[inner] if inner is not None else None
        if second is None or _key(second) != RESHAPE or second.get("tactic") or len(second["inputs"]) != 2:
            continue
        if second["inputs"][0] != step["outputs"][0] or len(step["inputs"]) < 2:
            continue
        shapes = step["inputs"][1:] if _key(step) == (DOMAIN, OP) else [step["inputs"][1]]
        zeros = (step.get("attrs") or {}).get("allowzero_each") or [int((step.get("attrs") or {}).get("allowzero", 0))]
        steps[inner] = {"op": OP, "domain": DOMAIN, "name": f"{step.get('name', '')}+{second.get('name', '')}",
                        "inputs": [step["inputs"][0], *shapes, second["inputs"][1]], "outputs": list(second["outputs"]),
                        "attrs": {"allowzero_each": [*zeros, int((second.get("attrs") or {}).get("allowzero", 0))]}}
        steps[index] = None
        readers = _readers(steps)  # the merged step may chain on (rare: a program has a few of these)
    return [step for step in steps if step is not None]


def fold_views(steps: list[dict], keep: set[str]) -> list[dict]:
    """The program with cancelling Transpose pairs dropped and Reshape chains merged (module doc)."""
    return _chain_reshapes(_drop_transpose_pairs(steps, keep), keep)


def reshape_chain(inputs, attrs, ctx):
    """x, shape_1 ... shape_n: x reshaped by each shape in turn, in one step."""
    x, shapes, zeros = inputs[0], inputs[1:], attrs["allowzero_each"]
    last = shapes[-1]
    if zeros[-1] or not (last == 0).any():
        return [x.reshape(last.tolist())]
    for shape, allowzero in zip(shapes, zeros):
        x = reshape([x, shape], {"allowzero": allowzero}, ctx)[0]
    return [x]


KERNELS = {(DOMAIN, OP): reshape_chain}
