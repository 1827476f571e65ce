"""Runs a kernel program: steps in order over named values, each value freed after its last use.

Everything that does not depend on the feeds is done once at construction: kernel lookup,
attribute decoding, last-use analysis and the onnxruntime sessions of island steps.

Shape arithmetic is memoized. Values computed only from weights and from the outputs of Shape /
Size steps depend on the input shapes alone, so those "static" steps run once per distinct set of
shapes the Shape steps observe (tracked as a small state machine over the observed shapes) and are
skipped afterwards. Exporters emit long Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains;
this takes them off the per-run path without any shape inference at build time.

An Executor runs one call at a time (the memo and the kernels' per-step plans are not locked).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import BadInput, InfcError
from .kernels import kernel_for
from .kernels.common import KernelContext, decode_attrs

ISLAND_OP = "__island__"
SHAPE_SOURCES = {("", "Shape"), ("", "Size")}  # outputs depend on the input's shape only
VOLATILE = {("", op) for op in ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                                "Bernoulli", "Multinomial", "Dropout")}
MAX_CACHED_SHAPES = 64  # distinct shape states remembered before the memo starts over

PLAIN, SOURCE, STATIC = 0, 1, 2


@dataclass
class _Step:
    run: Callable
    attrs: dict
    ctx: KernelContext
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    label: str
    key: tuple[str, str] = ("", "")
    frees: list[str] = field(default_factory=list)  # values whose last use is this step
    kind: int = PLAIN
    memo: dict = field(default_factory=dict)  # STATIC steps: shape state -> outputs


class Executor:
    def __init__(self, program_steps: list[dict], weights: dict[str, np.ndarray], opset: int,
                 islands: dict[str, bytes] | None = None, output_names: list[str] | None = None,
                 observer: Callable[[str, np.ndarray], None] | None = None):
        """`observer(name, array)`, when given, sees every value a step produces (e.g. to plan memory)."""
        self._weights = dict(weights)
        self._observer = observer
        self.opset = int(opset)
        if output_names is None:  # values nobody consumes
            consumed = {name for s in program_steps for name in s["inputs"]}
            output_names = [n for s in program_steps for n in s["outputs"] if n and n not in consumed]
        self.output_names = list(output_names)
        self.input_names = _graph_inputs(program_steps, self._weights)
        self._steps = [self._prepare(step, islands or {}) for step in program_steps]
        self._assign_frees()
        self._classify()
        self._states: dict[tuple, int] = {}

    def _prepare(self, step: dict, islands: dict[str, bytes]) -> _Step:
        domain = step.get("domain") or ""
        label = f"{domain}{'.' if domain else ''}{step['op']} '{step.get('name', '')}'"
        inputs, outputs = tuple(step["inputs"]), tuple(step["outputs"])
        if step["op"] == ISLAND_OP:
            section = step["section"]
            if section not in islands:
                raise BadInput(f"island step needs section '{section}', which the program does not carry")
            return _Step(_island_runner(islands[section], inputs, outputs), {}, KernelContext(self.opset),
                         inputs, outputs, label, (domain, ISLAND_OP))
        kernel = kernel_for(domain, step["op"])
        if kernel is None:
            raise BadInput(f"no runtime kernel for {label}")
        ctx = KernelContext(self.opset, [None] * len(outputs))
        return _Step(kernel, decode_attrs(step.get("attrs") or {}), ctx, inputs, outputs, label, (domain, step["op"]))

    def _assign_frees(self) -> None:
        keep = set(self.output_names) | set(self._weights)
        last_use: dict[str, int] = {}
        for index, step in enumerate(self._steps):
            for name in step.inputs + step.outputs:
                if name:
                    last_use[name] = index
        for name, index in last_use.items():
            if name not in keep:
                self._steps[index].frees.append(name)

    def _classify(self) -> None:
        static = set(self._weights)
        outputs = set(self.output_names)
        for step in self._steps:
            if step.key in SHAPE_SOURCES:
                step.kind = SOURCE
                static.update(n for n in step.outputs if n)
            elif (step.key not in VOLATILE and step.key[1] != ISLAND_OP and all(n in static for n in step.inputs if n)
                  and not any(n in outputs for n in step.outputs)):
                step.kind = STATIC
                static.update(n for n in step.outputs if n)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [name for name in self.input_names if name not in feeds]
        if missing:
            raise BadInput(f"missing input(s): {', '.join(missing)}")
        values = dict(self._weights)
        values.update(feeds)
        # a feed that overrides a weight (an initializer listed as a graph input) voids the memo
        memoize = feeds.keys().isdisjoint(self._weights)
        states = self._states
        observer = self._observer
        state = 0
        for step in self._steps:
            kind = step.kind if memoize else PLAIN
            if kind == STATIC:
                results = step.memo.get(state)
                if results is not None:
                    for name, value in zip(step.outputs, results):
                        if name:
                            values[name] = value
                            if observer is not None:
                                observer(name, value)
                    continue  # a static step frees nothing: its inputs are static too (or kept)
            try:
                results = step.run([values[n] if n else None for n in step.inputs], step.attrs, step.ctx)
            except InfcError:
                raise
            except Exception as exc:  # noqa: BLE001 - name the step that failed
                raise InfcError(f"{step.label} failed: {type(exc).__name__}: {exc}") from exc
            if kind == STATIC:
                step.memo[state] = results
            elif kind == SOURCE:
                key = (state, values[step.inputs[0]].shape)
                state = states.get(key) or self._new_state(key)
            for name, value in zip(step.outputs, results):
                if name:
                    values[name] = value
                    if observer is not None:
                        observer(name, value)
            for name in step.frees:
                values.pop(name, None)
        return {name: values[name] for name in self.output_names}

    def _new_state(self, key: tuple) -> int:
        if len(self._states) >= MAX_CACHED_SHAPES:  # many distinct shapes: forget them all, start over
            self._states.clear()
            for step in self._steps:
                step.memo.clear()
        self._states[key] = len(self._states) + 1
        return self._states[key]



def _graph_inputs(steps: list[dict], weights: dict) -> list[str]:
    produced, needed = set(weights), []
    for step in steps:
        for name in step["inputs"]:
            if name and name not in produced and name not in needed:
                needed.append(name)
        produced.update(n for n in step["outputs"] if n)
    return needed


def _island_runner(model_bytes: bytes, input_names, output_names) -> Callable:
    import onnxruntime as ort  # noqa: PLC0415 - only programs with islands need it

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])

    def _island(inputs, attrs, ctx):
        return session.run(list(output_names), dict(zip(input_names, inputs)))

    return _island
