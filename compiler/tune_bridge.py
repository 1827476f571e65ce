"""Bridges: the steps between onnxruntime tactic steps that may join their session.

A run of convolutions or GEMMs the build gave to onnxruntime (tune_vendor.py) is one session only
while nothing else sits between them; an EfficientNet's SiLU after each convolution, a pooling or a
LayerNorm splits the run, and every split costs onnxruntime a layout change back from its blocked
NCHWc form and a session call. A bridge is a step that onnxruntime can run as it stands (an ONNX or
onnxruntime contrib node with the standard's meaning, runtime/vendor_op.BRIDGE_OPS); it joins a run
only where that run holds a marked step, and only in a program variant the in-context check
(tune_context.confirm_in_context) measured faster and found to give the same outputs.

A step may bridge when onnxruntime's own schema registry knows its op at the model's opset with
every attribute it carries (so the session will load it as the model had it) and every value it
reads or writes, other than weights, has one of DTYPES at each profile level (the build records
the dtypes of those that are not float32 with the step, for the session's inputs).
"""

from __future__ import annotations

import functools

from .lower import Program
from .runtime.executor import PLAIN, memo_kinds
from .runtime.vendor_op import bridge_nodes, is_bridge_step

# What a bridge may read and write (weights aside): the masks and indices between a transformer's
# GEMMs (a NaN guard's IsNaN and Where, an embedding's Gather), a QDQ model's quantized values, an
# fp16 / bf16 plan's low-type values (its Casts round as infc's do, and the data movement between
# them is exact; a session onnxruntime will not load drops its variant), as well as float32 data
DTYPES = ("float32", "float16", "bfloat16", "bool", "int64", "int32", "int8", "uint8")


@functools.cache
def _schemas() -> dict[tuple[str, str], list[tuple[int, frozenset]]]:
    """(domain, op) -> [(since_version, attribute names)] from onnxruntime's registry."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c  # noqa: PLC0415 - only CPU builds with tactics need it

    table: dict[tuple[str, str], list[tuple[int, frozenset]]] = {}
    for schema in ort_c.get_all_operator_schema():
        if not schema.deprecated:
            table.setdefault((schema.domain, schema.name), []).append((int(schema.since_version), frozenset(schema.attributes)))
    return table


def _known_to_onnxruntime(step: dict, opset: int) -> bool:
    for node in bridge_nodes(step, opset):
        domain = node.get("domain") or ""
        versions = [v for v in _schemas().get((domain, node["op"]), []) if v[0] <= (opset if domain == "" else 1)]
        if not versions or not set(node.get("attrs") or {}) <= max(versions, key=lambda v: v[0])[1]:
            return False
    return True


def _shape_steps(program: Program) -> set[int]:
    """Steps that compute from weights and input shapes only (an exporter's Shape -> Gather ->
    Concat chains): the executor runs them once per input shapes (runtime/executor.memo_kinds), so
    they gain nothing inside a session, which would recompute them on every run."""
    kinds = memo_kinds([(((s.get("domain") or ""), s["op"]), s["inputs"], s["outputs"]) for s in program.steps],
                       set(program.weights), {o["name"] for o in program.outputs})
    return {index for index, kind in enumerate(kinds) if kind != PLAIN}


def bridge_candidates(program: Program, shapes_by_level: dict, shape_steps: bool = False) -> set[int]:
    """Indices of the steps that may bridge runs of tactic steps; with `shape_steps`, also the
    exporter's shape arithmetic between them (a transformer's Shape -> Gather -> Concat before each
    Reshape would otherwise split every layer's run in three: on a small model the session calls
    and thread wake-ups cost more than onnxruntime recomputing a few integers each run)."""
    found, memoized = set(), set() if shape_steps else _shape_steps(program)
    for index, step in enumerate(program.steps):
        if (step.get("tactic") or index in memoized or not is_bridge_step(step)
                or not _known_to_onnxruntime(step, program.opset)):
            continue
        values = [name for name in step["inputs"] if name and name not in program.weights]
        values += [name for name in step["outputs"] if name]
        if shapes_by_level and all(
                all((seen.get(name) or (None, None))[1] in DTYPES for name in values)
                for seen in shapes_by_level.values()):
            found.add(index)
    return found


def input_dtypes(step: dict, shapes_by_level: dict, weights: dict) -> dict[str, str]:
    """The step's inputs (not weights) that are not float32, with their dtypes: a session that the
    step starts reads them as such ("tactic_dtypes", runtime/vendor_op.py)."""
    seen = shapes_by_level.get("opt") or next(iter(shapes_by_level.values()), {})
    return {name: seen[name][1] for name in step["inputs"]
            if name and name not in weights and name in seen and seen[name][1] != "float32"}


def input_ranks(step: dict, shapes_by_level: dict, weights: dict,
                static_inputs: dict | None = None) -> dict[str, int | list[int]]:
    """The step's inputs (not weights) with the rank they have at every profile level: a session
    that the step starts declares them with it ("tactic_ranks", runtime/vendor_op.py). onnxruntime's
    NCHWc layout pass needs the rank: without it a pooling after the first convolution stays in
    NCHW and every residual convolution reading it reorders (a ResNet's first stage). A graph input
    the model declares with fixed dims (`static_inputs`: name -> dims, None where symbolic) is
    declared with them: the plan takes no other size there, and onnxruntime then knows the shapes
    after it (ResNet-50 in one session: 31.0 -> 28.9 ms, as fast as the model itself)."""
    ranks = {}
    for name in step["inputs"]:
        if not name or name in weights:
            continue
        if name in (static_inputs or {}):
            ranks[name] = list(static_inputs[name])
            continue
        seen = {len(level[name][0]) for level in shapes_by_level.values() if name in level}
        if len(seen) == 1 and all(name in level for level in shapes_by_level.values()):
            ranks[name] = seen.pop()
    return ranks


def input_lengths(step: dict, shapes_by_level: dict, weights: dict) -> dict[str, int]:
    """The step's 1-D integer inputs (not weights) with the length they have at every profile level,
    which a session that the step starts declares ("tactic_lengths"): a shape tensor's length is a
    rank, fixed by the model. onnx's shape inference refuses a Resize whose `sizes` are of unknown
    length when its input's rank is declared (Depth Anything's neck: every bridged variant failed
    to load)."""
    lengths = {}
    for name in step["inputs"]:
        if not name or name in weights or not all(name in level for level in shapes_by_level.values()):
            continue
        seen = {(tuple(level[name][0]), level[name][1]) for level in shapes_by_level.values()}
        shape, dtype = next(iter(seen)) if len(seen) == 1 else ((), "")
        if len(shape) == 1 and dtype.startswith(("int", "uint")):
            lengths[name] = int(shape[0])
    return lengths


def with_bridges(num_steps: int, keep: frozenset, bridges: set[int]) -> frozenset:
    """`keep` and the bridges that sit in a run of consecutive kept-or-bridge steps holding a kept
    step (a run of bridges alone stays infc's)."""
    chosen, run, anchored = set(keep), [], False
    for index in range(num_steps + 1):
        if index < num_steps and (index in keep or index in bridges):
            run.append(index)
            anchored |= index in keep
            continue
        if anchored:
            chosen.update(i for i in run if i in bridges)
        run, anchored = [], False
    return frozenset(chosen)
