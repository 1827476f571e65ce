"""Runs a kernel program: steps in order over named values, each value freed after its last use.

Everything that does not depend on the feeds is done once at construction: kernel lookup,
attribute decoding, last-use analysis, the onnxruntime sessions of island steps, and the mapping of
value names to slots of a flat list (a run copies one list and indexes it; no per-run dict churn).

Shape arithmetic is memoized. Values computed only from weights and from the outputs of Shape /
Size steps depend on the input shapes alone, so those "static" steps run once per distinct set of
shapes the Shape steps observe (tracked as a small state machine over the observed shapes) and are
skipped afterwards. Exporters emit long Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains;
this takes them off the per-run path without any shape inference at build time.

Load-time fusion: without an observer, a convolution whose only reader is an elementwise step with
scalar operands runs that step as its epilogue, block by block in cache (kernels/conv_epilogue.py),
a QuantizeLinear read only by a DequantizeLinear runs with it in one pass (kernels/fake_quant.py),
an fp16 / bf16 program's Cast pairs through the low type are one rounding step (cast_fold.py),
and Transpose pairs that cancel go and Reshape chains are one step (kernels/view_fold.py).
Steps the build gave to onnxruntime (`"tactic"`, compiler/tune_vendor.py) run in one-node sessions,
and runs of them in one session each (runtime/vendor_op.py).
The plan keeps the steps as built, so device executors and observers see them unchanged.

Buffer donation: a kernel marked `accepts_out` may write its first output into `ctx.out[0]`. When
one of its inputs dies at that step and nothing else can see it (it owns its memory and the
executor holds the only references), the executor offers that input's buffer there, so elementwise
chains run in place instead of allocating a fresh array per step.

Threads: a run keeps BLAS on one thread. On a few cores, OpenBLAS's thread hand-offs cost more
than they gain for all but large GEMMs, and when another process keeps a core busy a threaded call
stalls for scheduler ticks. Large work (GEMMs, convolution blocks, elementwise chains) is shared
with one helper thread instead (gemm_impls.parallel_for), which degrades to one-thread speed, not
below, when the helper does not get a core.

An Executor runs one call at a time (the memo and the kernels' per-step plans are not locked).
"""

from __future__ import annotations

import operator
import sys
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import BadInput, InfcError
from .cast_fold import fold_rounding
from .gemm_impls import blas_threads
from .kernels import kernel_for
from .kernels.amx_conv import skip_rounding_before_tiles
from .kernels.common import KernelContext, decode_attrs
from .kernels.conv_epilogue import fuse_conv_epilogues
from .kernels.fake_quant import fuse_fake_quantize
from .kernels.view_fold import fold_views
from .ort_call import named_feeds, session_runner
from .ort_crashes import optimizers_to_disable
from .shape_contract import contradicts_shapes, input_shapes_text
from .vendor_op import (GROUP_OP, TACTIC, group_runner, group_tactic_steps, is_bridge_step, is_vendor_step,
                        vendor_runner)

ISLAND_OP = "__island__"
SHAPE_SOURCES = {("", "Shape"), ("", "Size")}  # outputs depend on the input's shape only
VOLATILE = {("", op) for op in ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                                "Bernoulli", "Multinomial", "Dropout")}
# distinct sets of input shapes remembered before the memo starts over. A run walks one state per
# Shape step it passes, so the states allowed are this times the program's Shape steps (a cap on
# states alone would forget everything within one run of a model with more Shape steps than it).
MAX_CACHED_SHAPES = 64

PLAIN, SOURCE, STATIC = 0, 1, 2
NONE_SLOT, SINK_SLOT = 0, 1  # slot 0 always holds None (omitted inputs); unnamed outputs land in slot 1
# References to a donated input while the executor inspects it: its slot, the kernel's argument
# tuple, the local name and getrefcount's own argument. More means someone else can see the buffer.
_DONATION_REFS = 4
_getrefcount = sys.getrefcount


@dataclass(slots=True)
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
    args: tuple[int, ...] = ()  # slot of each input
    results: tuple[int, ...] = ()  # slot of each output
    drops: tuple[int, ...] = ()  # slots of `frees`
    donors: tuple[int, ...] = ()  # input positions whose buffer may become output 0 (see module doc)
    needed: bool = True  # STATIC steps: some output is read outside the step's segment or by a non-static step
    gather: Callable = tuple  # values -> this step's inputs (a tuple, built from `args`)
    single: bool = False  # exactly one output


class Executor:
    def __init__(self, program_steps: list[dict], weights: dict[str, np.ndarray], opset: int,
                 islands: dict[str, bytes] | None = None, output_names: list[str] | None = None,
                 observer: Callable[[str, np.ndarray], None] | None = None, trial: bool = False):
        """`observer(name, array)`, when given, sees every value a step produces (e.g. to plan memory).
        `trial`: one of several program variants the build times in turns (tune_context.py): its
        onnxruntime sessions, islands included, never spin-wait (spinning workers would slow the others;
        otherwise a program's only session does, runtime/vendor_op.py), and a session that does not load is
        only noted, not warned about."""
        self._trial = trial
        self._weights = dict(weights)
        self._observer = observer
        self.opset = int(opset)
        if output_names is None:  # values nobody consumes
            consumed = {name for s in program_steps for name in s["inputs"]}
            output_names = [n for s in program_steps for n in s["outputs"] if n and n not in consumed]
        self.output_names = list(output_names)
        if observer is None:  # an observer sees every value: it gets the program as planned
            program_steps = fuse_fake_quantize(program_steps, set(self.output_names))
            program_steps = fuse_conv_epilogues(program_steps, self._weights, set(self.output_names))
            program_steps = fold_rounding(program_steps, set(self.output_names))
            program_steps = skip_rounding_before_tiles(program_steps, set(self.output_names))
            program_steps = fold_views(program_steps, set(self.output_names))
            program_steps = group_tactic_steps(program_steps, self._weights, set(self.output_names))
        # one onnxruntime session for the whole of the tactic steps spins (runtime/vendor_op.py)
        sessions = [s for s in program_steps if s["op"] == GROUP_OP or (s.get("tactic") and is_vendor_step(s)
                                                                         and not is_bridge_step(s))]
        self._spin = not trial and observer is None and len(sessions) == 1
        self.input_names = _graph_inputs(program_steps, self._weights)
        self.notes: list[str] = []  # what did not run as planned (a tactic session that did not load)
        self._steps = [prepared for step in program_steps for prepared in self._prepare_or_own(step, islands or {})]
        # a program onnxruntime runs whole (islands, one session) calls no BLAS of ours: capping its
        # threads around every run would cost a tiny model's run a tenth of its time
        self._caps_blas = any(step.key[1] not in (ISLAND_OP, GROUP_OP) for step in self._steps)
        self._sole_island = self._the_sole_island()
        self._sole_writes_outputs = self._sole_island is not None and list(self._sole_island.outputs) == self.output_names
        self._input_set = frozenset(self.input_names)
        self._assign_frees()
        self._classify()
        self._assign_slots()
        self._states: dict[tuple, int] = {}
        self._max_states = MAX_CACHED_SHAPES * max(1, sum(step.kind == SOURCE for step in self._steps))
        self._current: _Step | None = None  # the step running (to name it when it fails)

    def _prepare_or_own(self, step: dict, islands: dict[str, bytes]) -> list[_Step]:
        """The step prepared; a step (or a run of them) the build gave to onnxruntime whose session
        this onnxruntime will not load (another version than the build's, say) runs on infc's
        kernels instead: slower than planned, never wrong or refused."""
        try:
            return [self._prepare(step, islands)]
        except Exception as exc:  # noqa: BLE001 - onnxruntime's errors have no common base
            if not step.get("tactic") and step["op"] != GROUP_OP:
                raise
            members = step.get("members") or [step]
            reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            self.notes.append(f"onnxruntime tactic '{step.get('name', step['op'])}' ({len(members)} steps): its session "
                              f"does not load here ({reason}); infc's kernels run it")
            if not self._trial:
                print(f"warning: {self.notes[-1]}", file=sys.stderr)
            plain = [{k: v for k, v in member.items() if not k.startswith("tactic")} for member in members]
            return [self._prepare(member, islands) for member in plain]

    def _prepare(self, step: dict, islands: dict[str, bytes]) -> _Step:
        domain = step.get("domain") or ""
        label = f"{domain}{'.' if domain else ''}{step['op']} '{step.get('name', '')}'"
        inputs, outputs = tuple(step["inputs"]), tuple(step["outputs"])
        if step["op"] == ISLAND_OP:
            section = step["section"]
            if section not in islands:
                raise BadInput(f"island step needs section '{section}', which the program does not carry")
            ops = ", ".join(step.get("ops") or ())  # what it runs, for errors and --op-profile
            return _Step(_island_runner(islands[section], inputs, outputs, spin=not self._trial, threads=step.get("tactic_threads")), {}, KernelContext(self.opset),
                         inputs, outputs, f"onnxruntime island '{section}' ({ops})", (domain, ISLAND_OP))
        if step["op"] == GROUP_OP:
            return _Step(group_runner(step, self._weights, decode_attrs, self.opset, self._spin, islands), {}, KernelContext(self.opset), inputs, outputs,
                         f"{len(step['members'])} steps in one onnxruntime session ({label})", (domain, GROUP_OP))
        kernel = kernel_for(domain, step["op"])
        if kernel is None:
            raise BadInput(f"no runtime kernel for {label}")
        attrs = decode_attrs(step.get("attrs") or {})
        if step.get("tactic") == TACTIC and is_vendor_step(step) and not is_bridge_step(step) and self._observer is None:
            threads = step.get("tactic_threads")
            kernel = vendor_runner(step["op"], domain, attrs, list(inputs),
                                   {name: self._weights[name] for name in inputs if name in self._weights}, threads,
                                   output_names=list(outputs))
            label += f" [onnxruntime{f', {threads} thread' if threads else ''}]"
        ctx = KernelContext(self.opset, [None] * len(outputs), bf16_tiles=bool(step.get("bf16_tiles")))
        return _Step(kernel, attrs, ctx, inputs, outputs, label, (domain, step["op"]))

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
        kinds = memo_kinds([(s.key, s.inputs, s.outputs) for s in self._steps], set(self._weights), set(self.output_names))
        for step, kind in zip(self._steps, kinds):
            step.kind = kind
        # Segments run between SOURCE steps under one shape state, so their static steps hit or miss
        # the memo together: on a hit, a static value read only by static steps of its own segment
        # need not be put in place at all.
        segment, produced_in = 0, {}
        for step in self._steps:
            if step.kind == SOURCE:
                segment += 1
            for name in step.inputs:
                origin = produced_in.get(name)
                if origin is not None and (step.kind != STATIC or segment != origin[1]):
                    origin[0].needed = True
            if step.kind == STATIC:
                step.needed = False
                for name in step.outputs:
                    if name:
                        produced_in[name] = (step, segment)

    def _assign_slots(self) -> None:
        slots: dict[str, int] = {}

        def slot(name: str, sink: int) -> int:
            if not name:
                return sink
            if name not in slots:
                slots[name] = len(slots) + 2
            return slots[name]

        for name in self._weights:
            slot(name, NONE_SLOT)
        for name in self.input_names:
            slot(name, NONE_SLOT)
        fixed = set(self._weights) | set(self.input_names) | set(self.output_names)
        for step in self._steps:
            step.args = tuple(slot(n, NONE_SLOT) for n in step.inputs)
            step.gather = _gatherer(step.args)
            step.results = tuple(slot(n, SINK_SLOT) for n in step.outputs)
            step.single = len(step.results) == 1
            step.drops = tuple(slots[n] for n in step.frees)
            if getattr(step.run, "accepts_out", False) and step.kind != STATIC and step.ctx.out:
                dying = set(step.frees) - fixed
                step.donors = tuple(i for i, n in enumerate(step.inputs) if n in dying and step.inputs.count(n) == 1)
        for name in self.output_names:
            slot(name, NONE_SLOT)
        self._slots = slots
        self._initial = [None] * (len(slots) + 2)
        for name, value in self._weights.items():
            self._initial[slots[name]] = value
        self._output_slots = [(name, slots[name]) for name in self.output_names]
        # _run_fast's loop unpacks these; `only_result` is the slot of a step's one output, else 0
        # (slot 0 never takes a result: it is the None of omitted inputs). `step.run` stays read from
        # the step: --op-profile swaps it for a timed one (step_profile.py)
        self._hot_steps = [(step, step.kind, step.gather, step.attrs, step.ctx, step.donors,
                            step.results[0] if step.single else 0, step.results, step.drops) for step in self._steps]

    def _the_sole_island(self) -> _Step | None:
        """The one step of a plan that is one onnxruntime session (an island: a model kept whole,
        tune_whole.py; or a group of all its tactic steps) reading the graph inputs and writing every
        output: its runs skip the slots and memo, whose microseconds are a tiny model's run time in
        onnxruntime over again."""
        if self._observer is not None or len(self._steps) != 1 or self._steps[0].key[1] not in (ISLAND_OP, GROUP_OP):
            return None
        step = self._steps[0]
        reads_inputs = set(step.inputs) <= set(self.input_names) and "" not in step.inputs
        return step if reads_inputs and set(self.output_names) <= set(step.outputs) else None

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not feeds.keys() >= self._input_set:  # a set comparison: the common case costs no Python loop
            missing = [name for name in self.input_names if name not in feeds]
            raise BadInput(f"missing input(s): {', '.join(missing)}")
        if self._sole_island is not None:
            return self._run_sole_island(feeds)
        values = self._initial.copy()
        slots = self._slots
        for name, value in feeds.items():
            index = slots.get(name)
            if index is not None:
                values[index] = value
        # a feed that overrides a weight (an initializer listed as a graph input) voids the memo
        memoize = feeds.keys().isdisjoint(self._weights)
        try:
            with blas_threads(1 if self._caps_blas else None):  # the module docstring: parallel work goes through parallel_for
                if memoize and self._observer is None:
                    self._run_fast(values)
                else:
                    self._run_general(values, memoize)
        except BaseException as exc:
            # a run cut short may leave a segment's memo half filled: forget it all
            step, self._current = self._current, None
            self._forget_shapes()
            if step is not None and step.donors:
                step.ctx.out[0] = None
            self._raise_failed(exc, step, feeds)
        return {name: values[index] for name, index in self._output_slots}

    def _run_sole_island(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        step = self._sole_island
        try:
            results = step.run([feeds[name] for name in step.inputs], step.attrs, step.ctx)
        except BaseException as exc:
            self._raise_failed(exc, step, feeds)
        if self._sole_writes_outputs:
            return dict(zip(self.output_names, results))
        produced = dict(zip(step.outputs, results))
        return {name: produced[name] for name in self.output_names}

    @staticmethod
    def _raise_failed(exc: BaseException, step: _Step | None, feeds: dict) -> None:
        """A run's failure as infc reports it: the step and its words, a shape the model cannot take as
        bad input."""
        if isinstance(exc, InfcError) or not isinstance(exc, Exception):
            raise exc
        label = step.label if step is not None else "run"
        first_line = (str(exc).strip().splitlines() or [""])[0]
        if contradicts_shapes(exc):
            raise BadInput(f"the model does not run at input shapes {input_shapes_text(feeds)}: "
                           f"{label}: {first_line}") from exc
        raise InfcError(f"{label} failed: {type(exc).__name__}: {exc}") from exc

    def _run_fast(self, values: list) -> None:
        """The hot loop: memoized shape arithmetic, no observer. Each step's fields come unpacked from
        one tuple (`_hot_steps`), and the running step is named only when one fails: on a model of
        tiny steps the executor's own Python is a good part of each step's time."""
        states, state, step = self._states, 0, None
        try:
            for step, kind, gather, attrs, ctx, donors, only_result, result_slots, drops in self._hot_steps:
                if kind == STATIC:
                    results = step.memo.get(state)
                    if results is not None:
                        if step.needed:
                            for index, value in zip(result_slots, results):
                                values[index] = value
                        continue  # a static step frees nothing: its inputs are static too (or kept)
                args = gather(values)
                if donors:
                    out = ctx.out
                    out[0] = _donation(args, donors)
                    results = step.run(args, attrs, ctx)
                    out[0] = None
                else:
                    results = step.run(args, attrs, ctx)
                if kind == STATIC:
                    step.memo[state] = results
                elif kind == SOURCE:
                    key = (state, args[0].shape)
                    state = states.get(key) or self._new_state(key)
                if only_result:
                    values[only_result] = results[0]
                else:
                    for index, value in zip(result_slots, results):
                        values[index] = value
                for index in drops:
                    values[index] = None
        except BaseException:
            self._current = step  # run() names it and clears its donated buffer
            raise

    def _run_general(self, values: list, memoize: bool) -> None:
        """Every value observed (and materialized), or no memo (a feed overrides a weight)."""
        observer, states, state = self._observer, self._states, 0
        for step in self._steps:
            self._current = step
            kind = step.kind if memoize else PLAIN
            if kind == STATIC:
                results = step.memo.get(state)
                if results is not None:
                    for index, value in zip(step.results, results):
                        values[index] = value
                    if observer is not None:
                        self._observe(step, results)
                    continue
            args = step.gather(values)
            if step.donors:
                step.ctx.out[0] = _donation(args, step.donors)
            results = step.run(args, step.attrs, step.ctx)
            if step.donors:
                step.ctx.out[0] = None
            if kind == STATIC:
                step.memo[state] = results
            elif kind == SOURCE:
                key = (state, args[0].shape)
                state = states.get(key) or self._new_state(key)
            for index, value in zip(step.results, results):
                values[index] = value
            if observer is not None:
                self._observe(step, results)
            for index in step.drops:
                values[index] = None
        self._current = None

    def _observe(self, step: _Step, results) -> None:
        for name, value in zip(step.outputs, results):
            if name:
                self._observer(name, value)

    def _new_state(self, key: tuple) -> int:
        if len(self._states) >= self._max_states:  # many distinct shapes: forget them all, start over
            self._forget_shapes()
        self._states[key] = len(self._states) + 1
        return self._states[key]

    def _forget_shapes(self) -> None:
        self._states.clear()
        for step in self._steps:
            step.memo.clear()


def _gatherer(slots: tuple[int, ...]) -> Callable:
    """values -> the step's inputs as a tuple; itemgetter is ~3x faster than a comprehension."""
    if not slots:
        return lambda values: ()
    if len(slots) == 1:
        only = slots[0]
        return lambda values: (values[only],)
    return operator.itemgetter(*slots)


def _donation(args, donors: tuple[int, ...]):
    """The first dying input nobody else can see: only the executor refers to it, and it owns its
    memory or is a whole-buffer view (a reshape) of an array nothing else refers to."""
    for position in donors:
        value = args[position]
        if type(value) is not np.ndarray or _getrefcount(value) > _DONATION_REFS:
            continue
        flags = value.flags
        if not (flags.writeable and flags.c_contiguous):
            continue
        base = value.base
        if base is None:
            return value
        # referenced by value.base, this local and getrefcount's argument: nothing else holds it
        if type(base) is np.ndarray and base.base is None and _getrefcount(base) <= 3 and base.size == value.size:
            return value
    return None


def _graph_inputs(steps: list[dict], weights: dict) -> list[str]:
    produced, needed = set(weights), []
    for step in steps:
        for name in step["inputs"]:
            if name and name not in produced and name not in needed:
                needed.append(name)
        produced.update(n for n in step["outputs"] if n)
    return needed


def memo_kinds(steps, weights: set[str], outputs: set[str]) -> list[int]:
    """Each step's kind, from (key, inputs, outputs) triples in program order: SOURCE (reads only
    an input's shape), STATIC (reads only weights and SOURCE/STATIC values: run once per distinct
    input shapes and memoized; not a program output, nothing random, not an island) or PLAIN."""
    static, kinds = set(weights), []
    for key, inputs, produced in steps:
        kind = PLAIN
        if key in SHAPE_SOURCES:
            kind = SOURCE
        elif (key not in VOLATILE and key[1] != ISLAND_OP and all(n in static for n in inputs if n)
              and not any(n in outputs for n in produced)):
            kind = STATIC
        if kind != PLAIN:
            static.update(n for n in produced if n)
        kinds.append(kind)
    return kinds


def _island_runner(model_bytes: bytes, input_names, output_names, spin: bool = True, threads: int | None = None) -> Callable:
    """An onnxruntime session over the island's subgraph. An input whose type or rank the build could
    not infer (the output of a contrib op ONNX's inference does not know, e.g. QLinearAdd; a Loop's
    stacked steps) takes the type and rank of the first array it is fed: the session is created at
    the first run then (onnxruntime sizes a Scan's body from its inputs' ranks, and refused to run one
    fed a value of no rank: 'Subgraph must have the shape set for all outputs'). `spin`:
    onnxruntime's default; off in a trial executor, whose variants take turns (the whole-model
    variant spinning after its run took the cores from the next one, and won races it should not).
    `threads`: the session's intra-op threads (None: onnxruntime's, a thread per core; a whole-model
    island may be timed faster at one, tune_whole.py)."""
    import onnx  # noqa: PLC0415
    import onnxruntime as ort  # noqa: PLC0415 - only programs with islands need it

    options = ort.SessionOptions()
    options.log_severity_level = 4  # a failure surfaces as the step's one-line error, not as ORT log lines
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads:
        options.intra_op_num_threads = int(threads)
    model = onnx.load_from_string(model_bytes)
    untyped = any(_is_unknown(value) for value in model.graph.input)
    disabled = optimizers_to_disable(model.graph.node) or None  # known onnxruntime crashes (ort_crashes.py)
    del model
    input_names, output_names = list(input_names), list(output_names)
    if not untyped:
        run = session_runner(ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"],
                                                  disabled_optimizers=disabled))
        del model_bytes  # a whole-model island (tune_whole.py) is the model itself: onnxruntime holds the weights

        def _island(inputs, attrs, ctx):
            return run(output_names, named_feeds(input_names, inputs))

        return _island
    # the bytes are kept only until the session exists
    pending, runs = [model_bytes], []
    del model_bytes

    def _island_typed_at_first_run(inputs, attrs, ctx):
        if not runs:
            runs.append(session_runner(ort.InferenceSession(_typed(pending.pop(), dict(zip(input_names, inputs))), options,
                                                            providers=["CPUExecutionProvider"], disabled_optimizers=disabled)))
        return runs[0](output_names, named_feeds(input_names, inputs))

    return _island_typed_at_first_run


def _typed(model_bytes: bytes, feeds: dict) -> bytes:
    import onnx  # noqa: PLC0415

    model = onnx.load_from_string(model_bytes)
    for value in model.graph.input:
        if _is_unknown(value) and value.name in feeds:
            array = np.asarray(feeds[value.name])
            if not value.type.tensor_type.elem_type:
                value.type.tensor_type.elem_type = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
                value.type.tensor_type.ClearField("shape")
            if not value.type.tensor_type.HasField("shape"):
                value.type.tensor_type.shape.SetInParent()  # rank known, dims free
                for _ in range(array.ndim):
                    value.type.tensor_type.shape.dim.add()
    return model.SerializeToString()


def _is_unknown(value) -> bool:
    """An island input of no type, no element type, or a tensor of no rank (not a sequence's)."""
    if value.type.WhichOneof("value") not in (None, "tensor_type"):
        return False
    tensor = value.type.tensor_type
    return not tensor.elem_type or not tensor.HasField("shape")
